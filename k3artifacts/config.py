"""Where the checkout's data directories are."""

from __future__ import annotations

from pathlib import Path

#: The checkout this package runs from (an editable install): where ``manifests/`` and
#: ``policies/`` are found when no environment variable points elsewhere.
CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
