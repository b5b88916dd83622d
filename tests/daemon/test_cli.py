"""The codecd command line: parsing, code files, WAV writing, errors, and end to end when codecrt is built."""

from __future__ import annotations

import json
import struct
import wave

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip

from codecd import cli

ORPHEUS_INFO = {"arch": "snac", "sample_rate": 24000, "hop_length": 512, "n_levels": 3,
                "codebook_sizes": (4096,) * 3, "level_strides": (4, 2, 1), "frame_multiple": 4,
                "weight_type": "f32", "n_params": 1, "weight_bytes": 4}


def test_write_wav_s16_clips(tmp_path):
    """16-bit WAV output follows the wire's rounding rule (clipped to int16) and reads back with wave."""
    p = tmp_path / "a.wav"
    cli.write_wav(p, np.array([0.0, 0.5, -2.0, 2.0], dtype=np.float32), 24000)
    with wave.open(str(p)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24000, 4)
        s = np.frombuffer(w.readframes(4), dtype="<i2")
    assert s.tolist() == [0, 16384, -32768, 32767]  # codecd.audio.f32_to_s16, as on the wire


def test_write_wav_f32_header(tmp_path):
    """--format f32 writes an IEEE-float WAV (format 3) with fmt, fact and data chunks, samples unchanged."""
    p = tmp_path / "f.wav"
    x = np.array([0.25, -1.5, 3.0], dtype=np.float32)
    cli.write_wav(p, x, 44100, "f32")
    b = p.read_bytes()
    assert b[:4] == b"RIFF" and b[8:12] == b"WAVE" and struct.unpack("<I", b[4:8])[0] == len(b) - 8
    fmt, rate, bits = struct.unpack("<H", b[20:22])[0], struct.unpack("<I", b[24:28])[0], struct.unpack("<H", b[34:36])[0]
    assert (fmt, rate, bits) == (3, 44100, 32)
    i = b.index(b"data")
    assert struct.unpack("<I", b[i + 4:i + 8])[0] == 12
    assert np.array_equal(np.frombuffer(b[i + 8:], dtype="<f4"), x)
    assert b"fact" in b[:i]


def test_load_codes_npz(tmp_path):
    """.npz level0..levelN arrays load as int32 levels; a gap in the names is an error."""
    p = tmp_path / "c.npz"
    np.savez(p, level0=np.array([1, 2]), level1=np.array([3, 4, 5, 6]), level2=np.arange(8))
    levels = cli.load_codes(p, "auto")
    assert [l.tolist() for l in levels] == [[1, 2], [3, 4, 5, 6], list(range(8))]
    assert all(l.dtype == np.int32 for l in levels)
    np.savez(p, level0=np.array([1]), level2=np.array([1]))
    with pytest.raises(cli.UsageError, match="level0, level1"):
        cli.load_codes(p, "auto")
    with pytest.raises(cli.UsageError, match="levels"):
        cli.load_codes(p, "orpheus")


def test_load_codes_npy_and_text(tmp_path, layouts):
    """.npy Orpheus codes / ids and text token files all give the same levels."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4096, size=7 * 3)
    want = layouts.orpheus_to_levels(codes)
    ids = layouts.codes_to_orpheus_ids(codes)
    np.save(tmp_path / "c.npy", codes)
    np.save(tmp_path / "i.npy", ids)
    (tmp_path / "t.txt").write_text("".join(layouts.ids_to_custom_tokens(ids)))
    (tmp_path / "n.txt").write_text(", ".join(map(str, ids)))
    for name, layout in (("c.npy", "auto"), ("c.npy", "orpheus"), ("i.npy", "auto"), ("i.npy", "orpheus-ids"),
                         ("t.txt", "auto"), ("n.txt", "auto"), ("n.txt", "orpheus-ids")):
        got = cli.load_codes(tmp_path / name, layout, ORPHEUS_INFO)
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), (name, layout)
    batch = np.stack([codes, codes[::-1]])
    np.save(tmp_path / "b.npy", batch)
    got = cli.load_codes(tmp_path / "b.npy", "auto", ORPHEUS_INFO)
    assert [l.shape for l in got] == [(2, 3), (2, 6), (2, 12)]


def test_load_codes_errors(tmp_path):
    """Missing files, partial groups, bad tokens and non-Orpheus models are UsageErrors with the file name."""
    with pytest.raises(cli.UsageError, match="not found"):
        cli.load_codes(tmp_path / "none.txt", "auto")
    (tmp_path / "p.txt").write_text("1 2 3 4 5 6 7 8")
    with pytest.raises(cli.UsageError, match="p.txt.*trailing"):
        cli.load_codes(tmp_path / "p.txt", "auto", ORPHEUS_INFO)
    assert cli.load_codes(tmp_path / "p.txt", "auto", ORPHEUS_INFO, drop_incomplete=True)[0].size == 1
    (tmp_path / "w.txt").write_text("1 2 x")
    with pytest.raises(cli.UsageError, match="'x'"):
        cli.load_codes(tmp_path / "w.txt", "auto")
    (tmp_path / "ok.txt").write_text("1 2 3 4 5 6 7")
    info4 = dict(ORPHEUS_INFO, n_levels=4, level_strides=(8, 4, 2, 1))
    with pytest.raises(cli.UsageError, match="3 levels"):
        cli.load_codes(tmp_path / "ok.txt", "auto", info4)
    with pytest.raises(cli.UsageError, match="npz"):
        cli.load_codes(tmp_path / "ok.txt", "levels")
    np.save(tmp_path / "f.npy", np.zeros(7, dtype=np.float32))
    with pytest.raises(cli.UsageError, match="integer"):
        cli.load_codes(tmp_path / "f.npy", "auto")


def test_format_info():
    """info output names arch, rate, hop, each level's codebook and stride, frame multiple, weights, params."""
    text = cli.format_info(dict(ORPHEUS_INFO, n_params=19_800_000, weight_bytes=79_200_000))
    for s in ("snac", "24000 Hz", "512 samples", "level 2:", "codebook 4096, stride 1 frame ",
              "stride 4 frames", "frame multiple: 4", "f32", "19,800,000"):
        assert s in text, s


def test_usage_errors_exit_2_without_traceback(tmp_path, capsys):
    """Bad arguments and bad convert inputs print 'codecd: error: ...' and exit 2, no traceback."""
    with pytest.raises(SystemExit) as ei:
        cli.main(["convert"])
    assert ei.value.code == 2
    capsys.readouterr()
    rc = cli.main(["convert", str(tmp_path / "missing"), "-o", str(tmp_path / "x.gguf")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("codecd: error: ") and "Traceback" not in err
    (tmp_path / "cfg.json").write_text(json.dumps({"bogus": 1}))
    (tmp_path / "w.bin").write_bytes(b"junk")
    rc = cli.main(["convert", str(tmp_path / "w.bin"), "-o", str(tmp_path / "x.gguf"),
                   "--config", str(tmp_path / "cfg.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "codecd: error:" in err and "Traceback" not in err


def test_reserved_subcommands_not_implemented(capsys):
    """serve/stream/play/voice are reserved names, not yet subcommands."""
    for name in cli.RESERVED:
        with pytest.raises(SystemExit) as ei:
            cli.main([name])
        assert ei.value.code == 2
    capsys.readouterr()


def test_cli_convert_f16(snac_cases, tmp_path, capsys):
    """codecd convert SRC -o DST --dtype f16 writes a model and reports it on stderr."""
    case = snac_cases("24khz")
    rc = cli.main(["convert", str(case.folder), "-o", str(tmp_path / "m.gguf"), "--dtype", "f16"])
    assert rc == 0 and (tmp_path / "m.gguf").is_file()
    assert "wrote" in capsys.readouterr().err


# --------------------------------------------------------- with the runtime


def test_info_and_decode_end_to_end(snac_cases, tmp_path, capsys, layouts):
    """codecd info and decode (npz levels, Orpheus text) on a converted random model match snac."""
    codecrt_or_skip()
    case = snac_cases("24khz")
    rc = cli.main(["info", str(case.gguf)])
    out = capsys.readouterr().out
    assert rc == 0 and "snac" in out and "24000" in out
    rng = np.random.default_rng(3)
    levels = reference.random_codes(case.config, 32, None, rng)
    np.savez(tmp_path / "c.npz", **{f"level{i}": l for i, l in enumerate(levels)})
    rc = cli.main(["decode", "--model", str(case.gguf), str(tmp_path / "c.npz"), "-o", str(tmp_path / "a.wav"),
                   "--format", "f32", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    b = (tmp_path / "a.wav").read_bytes()
    y = np.frombuffer(b[b.index(b"data") + 8:], dtype="<f4")
    ref = reference.reference_decode(case.model, levels)
    assert y.shape == ref.shape
    assert float(np.max(np.abs(y - ref))) < 1e-3
    ids = layouts.codes_to_orpheus_ids(layouts.levels_to_orpheus(levels))
    (tmp_path / "t.txt").write_text("".join(layouts.ids_to_custom_tokens(ids)))
    rc = cli.main(["decode", "-m", str(case.gguf), str(tmp_path / "t.txt"), "-o", str(tmp_path / "b.wav"),
                   "--device", "cpu"])
    assert rc == 0
    with wave.open(str(tmp_path / "b.wav")) as w:
        assert w.getnframes() == ref.size and w.getframerate() == 24000


@pytest.mark.parametrize("argv", [[], ["info"], ["convert"], ["decode"], ["stream"], ["play"],
                                  ["serve"], ["check-config"], ["voice"], ["voice", "add"],
                                  ["voice", "list"], ["doctor"]])
def test_every_help_prints(argv, capsys):
    """``--help`` of every subcommand prints and exits 0: the settings' help is formatted by
    argparse, whose % conversions once made ``codecd serve --help`` raise (a "%" in a help
    text)."""
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out
