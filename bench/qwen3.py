"""``python -m bench qwen3``: ``python -m bench mimi --codec qwen3`` (the Qwen3-TTS 12 Hz
tokenizer's decoder at its released size; see bench/mimi.py for the tables and options)."""

from __future__ import annotations

import sys

from bench import mimi


def main() -> int:
    sys.argv = [sys.argv[0], "--codec", "qwen3", *sys.argv[1:]]
    return mimi.main()


if __name__ == "__main__":
    sys.exit(main())
