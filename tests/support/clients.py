"""Another client of the same account: its identity key and pinned roots copied, no head of
any history remembered (``trust/heads.py``): a reader that never read the store."""

from __future__ import annotations

import shutil
from pathlib import Path


def fresh_config(config_home: Path, where: Path) -> Path:
    """A new ``XDG_CONFIG_HOME`` at ``where`` holding ``config_home``'s key and pins only."""
    mine = config_home / "k3artifacts"
    shutil.rmtree(where, ignore_errors=True)
    theirs = where / "k3artifacts"
    theirs.mkdir(parents=True, mode=0o700)
    shutil.copytree(mine / "keys", theirs / "keys", copy_function=shutil.copy2)
    shutil.copytree(mine / "trust", theirs / "trust", copy_function=shutil.copy2,
                    ignore=shutil.ignore_patterns("*.heads.json", ".*"))
    return where
