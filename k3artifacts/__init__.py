"""k3artifacts: turn a Hugging Face model revision into a verified, pinned, immutable release."""

__version__ = "0.1.0"
