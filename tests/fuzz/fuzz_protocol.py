"""atheris harness for codecd.protocol and codecd.session (run by hand, not by pytest).

    pip install atheris
    python tests/fuzz/fuzz_protocol.py -max_total_time=60      # libFuzzer flags
    python tests/fuzz/fuzz_protocol.py corpus_dir/            # keep a corpus

Each input is fed to parse_text (as UTF-8 text, with surrogates escaped) and
parse_binary; anything but ProtocolError is a finding. The same bytes then
drive a Session (a start, then the input as text and binary frames, then an
end and engine callbacks), which must never raise at all. Without atheris the
script says so and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "daemon"))

try:
    import atheris
except ImportError:  # optional dependency
    atheris = None


def main() -> int:
    if atheris is None:
        print("atheris is not installed (pip install atheris); skipping", file=sys.stderr)
        return 0

    with atheris.instrument_imports():
        import numpy as np

        from codecd.protocol import ProtocolError, encode_client, parse_binary, parse_text
        from codecd.protocol import Start
        from codecd.families import ModelSpec
        from codecd.session import Session

    spec = ModelSpec("snac_24khz", "snac", 24000, 512, 3, (4096,) * 3, (4, 2, 1),
                     layouts=("orpheus_ids", "orpheus", "levels"))
    layouts = ("orpheus_ids", "orpheus", "levels")

    def one(data: bytes) -> None:
        text = data.decode("utf-8", "surrogateescape")
        for fn, arg in ((parse_text, text), (parse_binary, data)):
            try:
                fn(arg)  # type: ignore[operator]
            except ProtocolError:
                pass
        s = Session({spec.name: spec})
        s.connect()
        layout = layouts[data[0] % 3] if data else "orpheus_ids"
        s.receive_text(encode_client(Start("a", spec.name, layout)))
        s.receive_text(text)
        s.receive_binary(b"\x01\xff\x01a" + data)
        s.receive_binary(data)
        key = s.stream_key("a")
        s.receive_text('{"type":"end","stream_id":"a"}')
        if key is not None:
            s.on_audio(key, np.frombuffer(data[: len(data) // 4 * 4], dtype="<f4"))
            s.on_done(key, 0)
        s.tick(1e12)
        s.connection_lost()

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
