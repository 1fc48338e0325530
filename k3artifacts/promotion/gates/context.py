"""What every gate is given: one :class:`GateContext` per tuple and channel being judged."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel

from k3artifacts.errors import CorruptManifest, NotFound, VerifyMismatch
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.policy.model import ChannelPolicy
from k3artifacts.policy.signed import Family, RecordTrust, made_by
from k3artifacts.releases.tuples import ReleaseTuple, tuple_manifest
from k3artifacts.revisions.manifest import ShardManifest, manifest_key
from k3artifacts.stores.base import Store

Signed = TypeVar("Signed", bound=BaseModel)

MAX_LISTED = 5  # problems named in one reason; the count says how many more


@dataclass
class GateContext:
    store: Store
    release: ReleaseTuple
    channel: str
    #: The channel's section of the store's policy in force: each gate reads its own settings.
    policy: ChannelPolicy
    #: That policy's files (suites, trusted keys), read in memory.
    document: PolicyDocument
    #: Who that policy trusts to have signed the evidence the gates read (reviews,
    #: evaluations, scans, preflights, traffic analyses): every record is read through it.
    trust: RecordTrust
    #: Who decides the move (the approver, when an approval record authorizes it); None in a
    #: dry run that names nobody (a flow before its approval).
    actor: Actor | None = None
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: Judge only the evidence this identity signed (``promotion/gates/evidence.py`` asks each
    #: identity in turn where the policy wants several); None: whoever signed it.
    signer: str | None = None

    def signed_here(self, records: list[Signed], family: Family[Any]) -> list[Signed]:
        """``records`` as this judgement counts them: those :attr:`signer` made, or all."""
        if self.signer is None:
            return records
        return [r for r in records if made_by(r, family) == self.signer]

    @cached_property
    def _manifest(self) -> tuple[ShardManifest | None, str]:
        # Read once, on first use, whichever gate asks first: a manifest lists thousands of
        # files and several gates need it.
        w = self.release.binding.weights
        key = manifest_key(w.repo_id, w.commit)
        try:
            return tuple_manifest(self.store, self.release), ""
        except (CorruptManifest, VerifyMismatch) as exc:  # names where it was read
            return None, str(exc).splitlines()[0]
        except NotFound:
            return (
                None,
                f"no manifest at {key} in {self.store.url}: the revision is not staged "
                "(or was deleted)",
            )

    @property
    def manifest(self) -> ShardManifest | None:
        """The tuple's manifest, or None: then :attr:`missing` says why."""
        return self._manifest[0]

    @property
    def missing(self) -> str:
        return self._manifest[1]


def summarize(problems: list[str]) -> str:
    shown = "; ".join(problems[:MAX_LISTED])
    more = len(problems) - MAX_LISTED
    return shown + (f"; and {more} more" if more > 0 else "")


def human_bytes(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"
