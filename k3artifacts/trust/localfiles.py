"""This client's own trust files (its personal key, the roots it pins, the heads it verified):
made private, and refused when another account could have written them.

A pinned root decides which keys this machine trusts for a store, and a personal key decides
who this account is: if another account could write either, that account would decide. So, as
ssh does for ``~/.ssh``, k3a creates them private (directory 0700, files 0600 whatever the
umask) and refuses one that is owned by another account or writable by one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from k3artifacts.errors import TrustRootError


def problem(path: Path, *, secret: bool) -> str | None:
    """Why ``path`` (a file of ours) cannot be trusted, or None. It and the directory that
    holds it must belong to this account (or root: a ConfigMap mounted in a pod) and be
    writable by no one else; a ``secret`` file must not be readable by anyone else either."""
    me = os.getuid()
    real = path.resolve()
    for item, is_file in ((real, True), (real.parent, False), (path.parent.resolve(), False)):
        info = item.stat()
        if info.st_uid not in (me, 0):
            return f"{item} belongs to uid {info.st_uid}, not to this account (uid {me})"
        if is_file and not stat.S_ISREG(info.st_mode):
            return f"{item} is not a regular file"
        others = 0o077 if (secret and is_file) else 0o022
        if info.st_mode & others:
            who = "read or written" if others == 0o077 else "written"
            return (f"{item} has mode {stat.S_IMODE(info.st_mode):04o}: it can be {who} by "
                    "other accounts")
    return None


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this account can use, made (with its parents) if absent."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid == os.getuid():
        path.chmod(0o700)
    return path


def write_new(path: Path, data: bytes, *, mode: int) -> None:
    """Create ``path`` holding ``data`` with exactly ``mode``; FileExistsError if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; never adds any
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_replacing(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` at once (a reader sees the old or the new file)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    write_new(temp, data, mode=mode)
    os.replace(temp, path)


def read_shared(path: Path, what: str, *, why: str) -> bytes | None:
    """``path``'s bytes (None when absent), a file others may read but only this account (or
    root) may write: TrustRootError naming ``what`` it is otherwise; ``why`` says what whoever
    could write it would decide."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TrustRootError(f"{what} {path}: {exc.strerror or exc}") from None
    unsafe = problem(path, secret=False)
    if unsafe:
        raise TrustRootError(f"{what} {path} refused: {unsafe}", hint=f"whoever could write it "
                             f"could {why}: check who did, then `chmod 644 {path}; chmod 700 "
                             f"{path.parent}`")
    return data


M = TypeVar("M", bound=BaseModel)


def read_store_file(path: Path, model: type[M], store_url: str, *, what: str, why: str,
                    hint: str, verb: str = "is") -> M | None:
    """``path`` (:func:`read_shared`) as ``model``, a file this client keeps for
    ``store_url`` (None when absent): TrustRootError naming ``what`` it is (``verb`` agreeing
    with it) when it is malformed or names another store (``model.store``); ``hint``: the
    next step then."""
    data = read_shared(path, what, why=why)
    if data is None:
        return None
    try:
        found = model.model_validate_json(data)
    except ValidationError as exc:
        raise TrustRootError(f"{what} {path} {verb} malformed: {exc.errors()[0]['msg']}",
                             hint=hint) from None
    named = found.store  # type: ignore[attr-defined]  # every such model names its store
    if named != store_url:
        raise TrustRootError(f"{what} {path} {verb} for {named}, not {store_url}", hint=hint)
    return found
