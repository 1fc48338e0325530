"""The project's own data, shipped inside the package: serving profiles, known vLLM flags and
schemas (``manifests/``) and the default policies (``policies/``).

The top-level ``manifests/`` and ``policies/`` of a checkout are the one copy people review
and edit; ``k3artifacts/data/manifests`` and ``k3artifacts/data/policies`` are links to them,
so an editable install reads the checkout in place and a wheel (``pip install .``, the worker
image) carries their content as package data. Either way the files are found through
``importlib.resources``, never by walking up from a source file to a checkout that an
installed package does not have.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _data(name: str) -> Path:
    # An installed wheel is unpacked on disk, so the resource is a real directory whose files
    # can be handed on by path (to yaml, jsonschema, a ConfigMap).
    return Path(str(resources.files("k3artifacts") / "data" / name)).resolve()


#: ``manifests/``: profiles/, schemas/, vllm-flags.txt.
MANIFESTS = _data("manifests")
#: ``policies/``: promotion-gates.yaml, signing/, eval-suites/, s3/, iam/.
POLICIES = _data("policies")
