"""Configuration of ``codecd serve``: defaults < TOML file < ``CODECD_*`` environment < flags.

Every setting is one field of :class:`Config` whose ``metadata`` carries its help
text; the environment variable is ``CODECD_<NAME>`` and the flag ``--<name>``
(underscores as dashes). Lists are comma-separated in the environment and in
flags. Models are ``NAME=SOURCE`` or ``NAME:PRECISION=SOURCE`` (``--model`` may be
repeated; ``CODECD_MODELS`` is a comma-separated list; TOML: ``[[models]]`` tables
with ``name``, ``source`` and optionally ``precision``). A model's precision is that
of its products, ``f32`` (the default), ``bf16`` or ``bf16x3`` (three BF16 products of
split operands, F32-grade; asked of its family in the worker, refused at start where it
cannot be had). A source is a GGUF path, ``hf:ORG/NAME``
(downloaded with ``huggingface_hub`` and converted once into ``cache_dir``) or
``demo`` (random SNAC 24 kHz weights: the audio is noise).

The TOML file is flat (``listen = "0.0.0.0:8765"``); keys may also be grouped in
tables (``[limits]``, ``[log]``...), which are merged: a table's keys are the
setting names (``[log] format = "json"`` is also accepted as ``log_format``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import tomllib

logger = logging.getLogger(__name__)

__all__ = ["Config", "ModelSource", "ConfigError", "load_config", "add_arguments",
           "resolve_models", "redacted", "format_config", "DEMO_SOURCE", "parse_listen",
           "build_demo_model", "demo_model_path", "ensure_demo_model", "DEMO_OUT_GAIN",
           "SECRET_FIELDS"]

DEMO_SOURCE = "demo"
SECRET_FIELDS = ("auth_token", "metrics_token", "upstream_key")
ENV_PREFIX = "CODECD_"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
METRICS_ACCESS = ("auto", "token", "loopback", "open")
PRECISIONS = ("f32", "bf16", "bf16x3")  # codecrt.Context(precision=...)
BATCH_SHAPES = ("auto", "pow2", "exact")  # codecrt.Context(batch_bucket=False / True / False)
FIRST_AUDIO = ("auto", "cadence", "now")  # the worker's Worker._express


class ConfigError(ValueError):
    """An invalid setting (exit status 2)."""


@dataclass(frozen=True)
class ModelSource:
    name: str
    source: str  # GGUF path, "hf:ORG/NAME" or "demo"
    #: of the model's products (codecrt.Context(precision=...)): "f32", or "bf16" or "bf16x3"
    #: where its family has BF16 products, on CPU workers (the worker refuses it otherwise)
    precision: str = "f32"


def _default_voices() -> str:
    from .families.voices import default_voices_dir

    return str(default_voices_dir())


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "codecd")


def _f(default: Any, help: str, *, factory: bool = False, metavar: str | None = None) -> Any:
    md = {"help": help, "metavar": metavar}
    if factory:
        return field(default_factory=default, metadata=md)
    return field(default=default, metadata=md)


@dataclass
class Config:
    """Every setting of the daemon (see docs/server.md for the reasons behind the limits)."""

    listen: str = _f("127.0.0.1:8765", "HOST:PORT to listen on (port 0: ephemeral)",
                     metavar="HOST:PORT")
    models: list[ModelSource] = _f(list, "models to load, NAME=SOURCE; SOURCE is a GGUF path, "
                                   "hf:ORG/NAME or demo (random weights: noise); "
                                   "NAME:bf16=SOURCE serves it with BF16 products, "
                                   "NAME:bf16x3=SOURCE with split BF16 products of F32's grade "
                                   "(where its family has them, on CPU workers with AVX512-BF16; "
                                   "refused at start otherwise)",
                                   factory=True, metavar="NAME[:PRECISION]=SOURCE")
    devices: list[str] = _f(lambda: ["auto"], "decode devices, one worker process each "
                            "(cpu, cuda:0, ...)", factory=True, metavar="DEV,...")
    threads: int = _f(0, "CPU threads per worker (0: all cores)")
    fronts: int = _f(0, "front processes (websockets, sessions) feeding the workers over "
                     "shared memory (0: 1 when every device is cpu, else one per usable core beyond "
                     "one per device and one for main, at most 8)")
    batch_buckets: list[int] = _f(list, "batch sizes warmed up at start (empty: the largest "
                                  "and 1)", factory=True, metavar="N,...")
    max_batch: int = _f(64, "most streams decoded in one graph (a tick with more ready steps them all, in several graphs)")
    batch_shapes: str = _f("auto", "a tick graph's batch: pow2 (the ready streams rounded up to a "
                           "power of two within max_batch: few graphs, padded compute), exact "
                           "(the ready streams only: a graph rebuilt inside the reserved buffers "
                           "when their count changes, no padding) or auto (exact, on every "
                           "device)")
    gather_ms: float = _f(2.0, "how long a worker waits to gather streams into a batch")
    tick_align_ms: float = _f(-1.0, "ticks on a cadence: a stream that becomes ready waits "
                              "until this many ms after the last tick started (the next multiple "
                              "of it after an idle period) unless every open stream is ready, so "
                              "streams spread over a frame period share one tick; at most one "
                              "tick starts per period "
                              "(0: off, gather_ms instead; e.g. 85.3, SNAC 24 kHz's period; -1: "
                              "auto, its models' shortest tick period, kept always on a worker "
                              "whose models run on a GPU and on the CPU only while the worker's "
                              "ticks fill 80 % of the last second, until they fill less than "
                              "40 %)")
    first_audio: str = _f("auto", "a stream's ticks until its first audio: cadence (at the "
                          "aligned ticks, with the other streams), now (at once, in a small "
                          "tick of the new streams alone between the aligned ones, as many as "
                          "end before the next: earlier first audio for a graph more per new "
                          "stream's chunk; for an exact stream on a GPU only the step of its "
                          "first audio, once its codes reach it, the steps before it at the "
                          "aligned ticks) or auto "
                          "(now, bounded by first_audio_gap_ms on a GPU; cadence on a GPU "
                          "whose bound is 0)")
    first_audio_gap_ms: float = _f(-1.0, "first_audio now: the longest gap after a stream's "
                                   "first audio that its express tick may open, ms (0: no "
                                   "bound; -1, auto: twice the models' shortest tick period on "
                                   "a GPU, 170 for SNAC 24 kHz, no bound on the CPU); the "
                                   "express tick waits until its audio comes at most this long "
                                   "before the aligned round that brings the stream's next "
                                   "chunk, so each ms of earlier first audio costs one of gap, "
                                   "and never more than this")
    tick_slack_ms: float = _f(5.0, "how long past the cadence's period an aligned tick waits "
                              "for the streams whose codes are not in yet (0: none); a stream "
                              "that misses its tick gets its audio a period later, unless "
                              "tick_catch_up steps it sooner")
    tick_catch_up: int = _f(0, "aligned ticks: a stream whose codes came after its round "
                            "started is stepped in a small tick of its own once they are in, "
                            "if the tick cost says it ends before the next round is due, "
                            "instead of a period later with that round; at most this many "
                            "such ticks between two rounds (0: off; on an H100 it changed "
                            "nothing measurable at 2,400 streams starting together and did "
                            "worse with starts spread over 3 s, docs/benchmarks.md)")
    max_streams: int = _f(64, "open streams server-wide (per model per worker in the engine); "
                          "over it a start gets 'busy'")
    max_streams_per_connection: int = _f(16, "open streams per connection "
                                         "('too_many_streams')")
    max_connections: int = _f(1024, "open websocket connections server-wide (HTTP 503)")
    max_connections_per_ip: int = _f(32, "open websocket connections per client IP (HTTP 503)")
    max_message_bytes: int = _f(64 * 1024, "largest client frame in bytes ('message_too_big')")
    max_queued_frames: int = _f(4096, "codec frames pushed but not yet decoded per stream "
                                "('backlog_exceeded')")
    idle_timeout_s: float = _f(30.0, "an open stream without input for this long fails")
    max_stream_duration_s: float = _f(600.0, "most audio seconds per stream")
    send_timeout_s: float = _f(5.0, "deadline of one send; a client that does not read is "
                               "closed with 'slow_reader'")
    sndbuf_bytes: int = _f(32768, "SO_SNDBUF of each accepted socket (0: the OS default)")
    output_budget_s: float = _f(2.5, "audio a connection may owe its client (queued or "
                                "being decoded) before its streams wait for it to read "
                                "(back-pressure; 0: no budget)")
    max_ahead_s: float = _f(1.0, "audio is sent at most this far ahead of real time per "
                            "stream (0: no pacing)")
    auth_token: str | None = _f(None, "bearer token required on the websocket upgrade "
                                "(Authorization: Bearer ...)")
    metrics_access: str = _f("auto", "who may read /metrics: auto (a bearer token when "
                             "metrics_token or auth_token is set, else anyone), token, "
                             "loopback (peers on 127.0.0.0/8 or ::1 only), open")
    metrics_token: str | None = _f(None, "bearer token for /metrics (default: auth_token)")
    allowed_origins: list[str] = _f(list, "Origin values allowed on the upgrade (empty: any; "
                                    "requests without Origin are always allowed)",
                                    factory=True, metavar="ORIGIN,...")
    drain_timeout_s: float = _f(10.0, "on SIGTERM, how long open streams may finish")
    log_format: str = _f("text", "log format: text or json")
    log_level: str = _f("info", "log level: debug, info, warning, error")
    cache_dir: str = _f(_default_cache(), "where hf: and demo models are converted to")
    voices_dir: str = _f(str(_default_voices()), "voice files for models that need a voice "
                         "(S3Gen; codecd voice add NAME conds.pt)")
    flow_first_chunk: int = _f(10, "S3Gen streams: tokens in the first chunk (time to first audio)")
    flow_chunk: int = _f(25, "S3Gen streams: tokens in each later chunk (the fewest a later chunk waits for)")
    flow_chunk_growth: float = _f(1.0, "S3Gen streams: later chunk k takes as many tokens as have "
                                  "arrived, up to min(flow_max_chunk, flow_chunk x growth^(k-1)) (1..8; "
                                  "1: every chunk flow_chunk tokens; needs max_ahead_s and "
                                  "output_budget_s above the largest chunk's audio; docs/s3gen.md)")
    flow_max_chunk: int = _f(0, "S3Gen streams: the most tokens a grown chunk takes (0: 4 x flow_chunk)")
    flow_steps: int = _f(0, "S3Gen streams: flow (Euler) steps per chunk (0: the model's default)")
    # speech front (codecd.speech; docs/speech.md): HTTP beside the websocket port
    http_port: int = _f(-1, "port of the OpenAI-compatible HTTP speech endpoint on the listen "
                        "host (POST /v1/audio/speech; -1: off, 0: ephemeral); needs --upstream")
    upstream: str | None = _f(None, "OpenAI-compatible completions server the speech endpoint "
                              "and websocket text streams get Orpheus tokens from "
                              "(http://HOST:PORT[/v1])", metavar="URL")
    upstream_key: str | None = _f(None, "bearer key sent to the upstream")
    upstream_model: str = _f("orpheus", "model name sent to the upstream")
    upstream_timeout_s: float = _f(30.0, "upstream connect timeout and longest silence within "
                                   "its stream")
    flow_precision: str = _f("f32", "S3Gen models: precision of their products, f32, bf16 or bf16x3 "
                             "(CPU workers on x86-64 with AVX512-BF16 only; bf16 about 2x faster "
                             "at a relative error of 1e-2, bf16x3 F32-grade, faster only on AMX "
                             "CPUs; see docs/runtime.md)")

    # ------------------------------------------------------------- derived

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]

    def validate(self) -> list[str]:
        """Every problem found (empty: valid)."""
        errs: list[str] = []
        try:
            parse_listen(self.listen)
        except ConfigError as e:
            errs.append(str(e))
        if not (1 <= self.flow_first_chunk <= 4096 and 1 <= self.flow_chunk <= 4096):
            errs.append(f"flow_first_chunk = {self.flow_first_chunk}, flow_chunk = {self.flow_chunk}: "
                        "each must be in 1..4096")
        if not (1.0 <= self.flow_chunk_growth <= 8.0
                and (self.flow_max_chunk == 0 or self.flow_chunk <= self.flow_max_chunk <= 4096)):
            errs.append(f"flow_chunk_growth = {self.flow_chunk_growth}, flow_max_chunk = {self.flow_max_chunk}: "
                        "the growth must be in 1..8 and the largest chunk 0 (4 x flow_chunk) or in "
                        "flow_chunk..4096")
        if not 0 <= self.flow_steps <= 100:
            errs.append(f"flow_steps = {self.flow_steps}: must be in 0..100 (0: the model's default)")
        if self.first_audio not in FIRST_AUDIO:
            errs.append(f"first_audio: one of {', '.join(FIRST_AUDIO)}, got {self.first_audio!r}")
        if self.batch_shapes not in BATCH_SHAPES:
            errs.append(f"batch_shapes: one of {', '.join(BATCH_SHAPES)}, got {self.batch_shapes!r}")
        if problem := _precision_problem("flow_precision", self.flow_precision, self.devices):
            errs.append(problem)
        names = [m.name for m in self.models]
        if not self.models:
            errs.append("models: none configured (e.g. --model snac_24khz=/path/model.gguf, "
                        "or --model demo=demo for random weights)")
        if len(set(names)) != len(names):
            errs.append(f"models: duplicate names in {names}")
        for m in self.models:
            if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,128}", m.name):
                errs.append(f"models: bad name {m.name!r} (letters, digits, _ . -)")
            if problem := _precision_problem(f"models: {m.name}: precision", m.precision,
                                             self.devices):
                errs.append(problem)
            s = m.source
            if s == DEMO_SOURCE:
                continue
            if s.startswith("hf:"):
                if not re.fullmatch(r"hf:[\w.\-]+/[\w.\-]+", s):
                    errs.append(f"models: {m.name}: bad source {s!r} (hf:ORG/NAME)")
                continue
            if not Path(s).is_file():
                errs.append(f"models: {m.name}: no such GGUF file {s!r}")
        if not self.devices:
            errs.append("devices: at least one is needed")
        ints = {"threads": 0, "fronts": 0, "max_batch": 1, "max_streams": 1, "max_streams_per_connection": 1,
                "max_connections": 1, "max_connections_per_ip": 1, "max_queued_frames": 1,
                "sndbuf_bytes": 0, "tick_catch_up": 0}
        for k, lo in ints.items():
            if getattr(self, k) < lo:
                errs.append(f"{k}: must be >= {lo}, got {getattr(self, k)}")
        if self.max_message_bytes < 1024:
            errs.append(f"max_message_bytes: must be >= 1024, got {self.max_message_bytes}")
        for k in ("idle_timeout_s", "max_stream_duration_s", "send_timeout_s",
                  "drain_timeout_s"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                errs.append(f"{k}: must be > 0, got {v}")
        for k in ("gather_ms", "max_ahead_s", "output_budget_s", "tick_align_ms", "tick_slack_ms",
                  "first_audio_gap_ms"):
            v = getattr(self, k)
            auto = k in ("tick_align_ms", "first_audio_gap_ms")
            if auto and v == -1:
                continue
            if not (math.isfinite(v) and v >= 0):
                errs.append(f"{k}: must be >= 0, got {v}" + (" (or -1: auto)" if auto else ""))
        if any(b < 1 for b in self.batch_buckets):
            errs.append(f"batch_buckets: sizes must be >= 1, got {self.batch_buckets}")
        if self.log_format not in LOG_FORMATS:
            errs.append(f"log_format: one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.log_level not in LOG_LEVELS:
            errs.append(f"log_level: one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.metrics_access not in METRICS_ACCESS:
            errs.append(f"metrics_access: one of {', '.join(METRICS_ACCESS)}, got "
                        f"{self.metrics_access!r}")
        elif self.metrics_access == "token" and not (self.metrics_token or self.auth_token):
            errs.append("metrics_access: token needs metrics_token or auth_token")
        if not -1 <= self.http_port <= 65535:
            errs.append(f"http_port: -1 (off), 0 (ephemeral) or a port, got {self.http_port}")
        if self.http_port >= 0 and not self.upstream:
            errs.append("http_port: the speech endpoint needs --upstream URL (an OpenAI-"
                        "compatible completions server)")
        if self.upstream and not re.match(r"https?://[^/\s]+", self.upstream):
            errs.append(f"upstream: expected http(s)://HOST:PORT[/v1], got {self.upstream!r}")
        if not (math.isfinite(self.upstream_timeout_s) and self.upstream_timeout_s > 0):
            errs.append(f"upstream_timeout_s: must be > 0, got {self.upstream_timeout_s}")
        if self.auth_token is not None and not self.auth_token:
            errs.append("auth_token: empty (leave it unset for no authentication)")
        return errs


def _precision_problem(what: str, precision: str, devices: list[str]) -> str | None:
    """What is wrong with ``precision`` (of ``what``) on ``devices``, or None. BF16 off the CPU
    is caught here rather than by each worker at load ("auto" may be a GPU)."""
    if precision not in PRECISIONS:
        return f"{what}: one of {', '.join(PRECISIONS)}, got {precision!r}"
    if precision != "f32" and any(d != "cpu" for d in devices):
        return (f"{what} {precision} runs on CPU workers only: devices must all be cpu, got "
                f"{','.join(devices)}")
    return None


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_KIND: dict[str, str] = {}
for _n, _fl in FIELDS.items():
    _t = str(_fl.type)
    _KIND[_n] = ("models" if _n == "models" else "list_int" if _t == "list[int]" else
                 "list_str" if _t.startswith("list") else "int" if _t == "int" else
                 "float" if _t == "float" else "str")


def parse_listen(s: str) -> tuple[str, int]:
    host, sep, port = str(s).rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: expected HOST:PORT, got {s!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


_MODEL_KEYS = ("name", "source", "precision")


def _parse_models(v: Any, where: str) -> list[ModelSource]:
    out: list[ModelSource] = []
    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, list):
        raise ConfigError(f"{where}: models: expected a list")
    for it in items:
        if isinstance(it, Mapping):
            if not isinstance(it.get("name"), str) or not isinstance(it.get("source"), str):
                raise ConfigError(f"{where}: models: each needs string name and source")
            unknown = sorted(set(it) - set(_MODEL_KEYS))
            if unknown:  # a misspelt precision must not serve F32 silently
                raise ConfigError(f"{where}: models: {it['name']}: unknown keys {unknown} "
                                  f"(a model has {', '.join(_MODEL_KEYS)})")
            precision = it.get("precision", "f32")
            if not isinstance(precision, str):
                raise ConfigError(f"{where}: models: {it['name']}: precision must be a string, "
                                  f"got {precision!r}")
            out.append(ModelSource(it["name"], it["source"], precision.lower()))
        elif isinstance(it, str):
            if not it.strip():
                continue
            name, sep, src = it.strip().partition("=")
            if not sep:
                raise ConfigError(f"{where}: models: expected NAME=SOURCE, got {it!r}")
            # a name cannot hold ":" (Config.validate), so NAME:PRECISION=SOURCE is unambiguous
            # whatever the source holds
            name, colon, precision = name.partition(":")
            if colon and not precision.strip():
                raise ConfigError(f"{where}: models: expected NAME:PRECISION=SOURCE, got {it!r}")
            out.append(ModelSource(name.strip(), src.strip(),
                                   precision.strip().lower() if colon else "f32"))
        else:
            raise ConfigError(f"{where}: models: bad entry {it!r}")
    return out


def _coerce(name: str, v: Any, where: str) -> Any:
    kind = _KIND[name]
    try:
        if kind == "models":
            return _parse_models(v, where)
        if kind in ("list_str", "list_int"):
            if isinstance(v, str):
                v = [x.strip() for x in v.split(",") if x.strip()]
            if not isinstance(v, list):
                raise ValueError("expected a list")
            return [int(x) for x in v] if kind == "list_int" else [str(x) for x in v]
        if kind == "int":
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError("expected an integer")
            return int(v)
        if kind == "float":
            if isinstance(v, bool):
                raise ValueError("expected a number")
            return float(v)
        if v is None or (name in SECRET_FIELDS + ("upstream",) and v == ""):
            return None
        if not isinstance(v, str):
            raise ValueError("expected a string")
        return v.lower() if name in ("log_format", "log_level", "flow_precision",
                                     "metrics_access", "batch_shapes", "first_audio") else v
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {name}: {e} (got {v!r})") from None


def _flatten_toml(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in FIELDS:
            out[k] = v
        elif isinstance(v, Mapping):
            for k2, v2 in v.items():
                for cand in (k2, f"{k}_{k2}"):
                    if cand in FIELDS:
                        out[cand] = v2
                        break
                else:
                    raise ConfigError(f"{path}: unknown setting [{k}] {k2}")
        else:
            raise ConfigError(f"{path}: unknown setting {k!r}")
    return out


def _default(fl: dataclasses.Field[Any]) -> Any:
    if fl.default is not dataclasses.MISSING:
        return fl.default
    factory: Any = fl.default_factory
    return factory()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per setting (default None: not given), plus ``--config FILE``."""
    p.add_argument("--config", "-c", metavar="FILE", default=None,
                   help="TOML config file (env CODECD_CONFIG)")
    for name, fl in FIELDS.items():
        default = _default(fl)
        if name in SECRET_FIELDS:
            shown = "unset"
        elif isinstance(default, list):
            shown = ",".join(str(x) for x in default) or "empty"
        else:
            shown = str(default)
        h = f"{fl.metadata['help']} [default: {shown}; env {ENV_PREFIX}{name.upper()}]"
        h = h.replace("%", "%%")  # argparse formats help with %: "80 % of" was a conversion
        flag = "--" + name.replace("_", "-")
        if name == "models":
            p.add_argument("--model", "-m", dest="models", action="append", default=None,
                           metavar="NAME=SOURCE", help=h)
        else:
            p.add_argument(flag, dest=name, default=None, metavar=fl.metadata.get("metavar"),
                           help=h)


def load_config(path: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None,
                args: argparse.Namespace | Mapping[str, Any] | None = None, *,
                validate: bool = True) -> Config:
    """Defaults, then the TOML file (``path``, else ``CODECD_CONFIG``), then ``CODECD_*``
    variables of ``env`` (default ``os.environ``), then the flags in ``args`` (None values
    are "not given"). Raises :class:`ConfigError` for unknown keys, bad values and
    every problem of :meth:`Config.validate` (unless ``validate`` is false: ``codecd
    doctor`` shows a config that serve would refuse)."""
    env = os.environ if env is None else env
    a: dict[str, Any] = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    path = path or a.get("config") or env.get(ENV_PREFIX + "CONFIG")
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        for k, v in _flatten_toml(data, str(path)).items():
            values[k] = _coerce(k, v, str(path))
    for name in FIELDS:
        ev = env.get(ENV_PREFIX + name.upper())
        if ev is not None:
            values[name] = _coerce(name, ev, f"${ENV_PREFIX}{name.upper()}")
    for name in FIELDS:
        v = a.get(name)
        if v is None:
            continue
        if name == "models" and isinstance(v, list):
            v = [x for item in v for x in (item.split(",") if isinstance(item, str) else [item])]
        values[name] = _coerce(name, v, "--" + name.replace("_", "-"))
    cfg = Config(**values)
    errs = cfg.validate() if validate else []
    if errs:
        raise ConfigError("; ".join(errs))
    return cfg


def redacted(cfg: Config) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    for k in SECRET_FIELDS:
        if d.get(k):
            d[k] = "<redacted>"
    return d


def format_config(cfg: Config) -> str:
    """The effective config as TOML (secrets redacted)."""
    lines: list[str] = []
    d = redacted(cfg)
    models = d.pop("models")

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    for k, v in d.items():
        if v is None:
            lines.append(f"# {k} = (unset)")
        else:
            lines.append(f"{k} = {val(v)}")
    for m in models:
        lines += ["", "[[models]]", f"name = {val(m['name'])}", f"source = {val(m['source'])}",
                  f"precision = {val(m['precision'])}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------- model sources


def resolve_models(cfg: Config) -> dict[str, str]:
    """Model name -> GGUF path, downloading/converting ``hf:`` and building ``demo`` sources
    into ``cache_dir`` once (later starts reuse the file)."""
    out: dict[str, str] = {}
    cache = Path(cfg.cache_dir).expanduser()
    for m in cfg.models:
        if m.source == DEMO_SOURCE:
            path = demo_model_path(cache)
            if not path.is_file():
                cache.mkdir(parents=True, exist_ok=True)
                build_demo_model(path)
            logger.warning("model %s is the DEMO model: random SNAC 24 kHz weights, its audio "
                           "is NOISE (at about -20 dBFS); for testing the service only", m.name)
            out[m.name] = str(path)
        elif m.source.startswith("hf:"):
            out[m.name] = str(_hf_model(m.source[3:], cache))
        else:
            out[m.name] = str(Path(m.source))
    return out


def _hf_model(repo: str, cache: Path) -> Path:
    dst = cache / (repo.replace("/", "__") + ".gguf")
    if dst.is_file():
        return dst
    try:
        from huggingface_hub import snapshot_download  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ConfigError(f"hf:{repo} needs the huggingface_hub package "
                          "(pip install huggingface_hub)") from None
    from .convert import convert

    logger.info("downloading %s from the Hugging Face hub", repo)
    folder = snapshot_download(repo, allow_patterns=["config.json", "*.bin", "*.safetensors"])
    cache.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s to %s", repo, dst)
    return convert(folder, dst, progress=False, source=f"hf:{repo}")


#: SNAC 24 kHz (hubertsiuzdak/snac_24khz) hyperparameters, for the demo model
DEMO_SNAC: dict[str, Any] = {
    "sampling_rate": 24000, "latent_dim": 768, "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2], "attn_window_size": 0, "codebook_size": 4096,
    "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
}


#: gain of the demo model's last convolution: a decode of uniform random codes comes out at
#: about -20 dBFS RMS (measured: -19.7 to -20.1 dB over 5 seeds, 1 s each), not saturated
#: full-scale noise
DEMO_OUT_GAIN = 2e-4
DEMO_DESCRIPTION = ("codecd demo: SNAC 24 kHz shapes with seeded random weights (seed 0), a real "
                    "decode whose audio is noise; the last convolution is scaled by 2e-4 so the "
                    "output sits near -20 dBFS RMS instead of full-scale")


def demo_model_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the demo model lives in ``cache_dir`` (default: the configured default); the
    name carries the version of its recipe, so a file from an older recipe is not reused."""
    return Path(cache_dir if cache_dir is not None else _default_cache()).expanduser() \
        / "demo_snac_24khz.v2.gguf"


def ensure_demo_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The demo model's path, built on first use."""
    path = demo_model_path(cache_dir)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_demo_model(path)
    return path


def build_demo_model(path: str | os.PathLike[str], seed: int = 0,
                     hp: Mapping[str, Any] | None = None) -> Path:
    """Write a random-weight SNAC GGUF with the 24 kHz model's shapes (its audio is noise,
    at about -20 dBFS RMS: :data:`DEMO_OUT_GAIN`)."""
    from .convert.random_snac import write_random_snac

    out = write_random_snac(path, DEMO_SNAC if hp is None else hp, seed=seed, name="snac_demo_random",
                            out_gain=DEMO_OUT_GAIN, description=DEMO_DESCRIPTION)
    logger.info("wrote demo model %s", out)
    return out
