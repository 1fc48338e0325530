"""Names of upstream revisions: ``org/name`` repo ids and 40-hex commits."""

from __future__ import annotations

import re

from .errors import ConfigError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise ConfigError(f"{repo_id!r} is not a Hub repo id", hint="write it as org/name")
    return repo_id
