"""codecd: a streaming decode daemon for neural audio codecs.

The package holds the model converter (:mod:`codecd.convert`, checkpoints to
the GGUF files that the ``codecrt`` runtime loads) and the command line
(:mod:`codecd.cli`). Decoding itself happens in the native runtime, reached
through the ``codecrt`` Python bindings.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
