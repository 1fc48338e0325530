"""Names of upstream revisions: ``org/name`` repo ids, 40-hex commits, and the pinned
``org/name@<commit>`` reference every command that takes a revision parses here."""

from __future__ import annotations

import re
from typing import NamedTuple

from k3artifacts.errors import UsageError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
#: A manifest digest: the sha256 hex of the manifest's canonical JSON.
MANIFEST_DIGEST = re.compile(r"^[0-9a-f]{64}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


#: The Hub's own limit on a repo id (org and name together), which keeps every path and
#: store key built from it within what file systems and S3 hold.
REPO_ID_MAX = 96


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise UsageError(f"{repo_id[:120]!r} is not a Hub repo id", hint="write it as org/name")
    if len(repo_id) > REPO_ID_MAX:
        raise UsageError(f"repo id of {len(repo_id)} characters ({repo_id[:40]}...): the Hub "
                         f"allows {REPO_ID_MAX}", hint="check the repo id")
    return repo_id


class RevisionRef(NamedTuple):
    """A pinned revision: a repo id and a 40-hex commit (never a branch or tag)."""

    repo_id: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.commit}"


def match_revision_ref(text: str) -> RevisionRef | None:
    """``org/name@<40-hex commit>`` as a :class:`RevisionRef`, or None if ``text`` is not one."""
    repo_id, sep, commit = text.rpartition("@")
    if not sep or not COMMIT.match(commit) or not REPO_ID.match(repo_id) or ".." in repo_id:
        return None
    return RevisionRef(repo_id, commit)


def parse_revision_ref(text: str) -> RevisionRef:
    """Like :func:`match_revision_ref`, but a malformed reference is an error that says how to
    write it."""
    ref = match_revision_ref(text)
    if ref is None:
        raise UsageError(
            f"{text!r} is not a pinned revision",
            hint="write org/name@<40-hex commit>; list staged commits with "
            "`k3a revision list org/name`",
        )
    return ref


def check_manifest_digest(digest: str) -> str:
    """A manifest digest as typed by an operator: 64 lowercase hex, nothing else."""
    if not MANIFEST_DIGEST.match(digest):
        raise UsageError(
            f"{digest!r} is not a manifest digest",
            hint="a manifest digest is 64 hex characters, as printed by `k3a stage`, "
            "`k3a revision list` and `k3a tuple show`",
        )
    return digest
