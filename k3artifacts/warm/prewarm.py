"""What ``k3a pull`` and a pod's start do with a tuple's warm artifact: bring it next to the
weights, and hand it to the server, each as one call that never fails the caller over the
artifact: any reason not to use it is a :class:`~.trust.WarmMiss`, logged on the
``k3artifacts.warm`` logger with its name, and the server compiles cold."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from k3artifacts.errors import K3AError, UnsafeCacheEntry
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import tuple_layout
from k3artifacts.warm.node import WarmUse, pull_warm, use_cold, use_warm
from k3artifacts.warm.trust import WarmMiss, WarmTrust, check_manifest, warm_trust

log = logging.getLogger("k3artifacts.warm")


@dataclass
class WarmOutcome:
    """One line of a report: used (pulled / ready) or a miss with its reason."""

    tuple_id: str
    gpu: str | None
    layout: str
    ok: bool
    reason: str | None = None
    detail: str | None = None
    path: str | None = None
    files: int = 0
    bytes: int = 0
    already_present: bool = False
    env: dict[str, str] | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def line(self) -> str:
        if self.ok:
            return (f"warm start: {self.files} files, {self.bytes:,} bytes "
                    f"({self.gpu}, {self.layout}) at {self.path}")
        return f"warm start miss: {self.reason}: {self.detail} (the server compiles cold)"


def _miss(outcome: WarmOutcome, exc: Exception) -> WarmOutcome:
    if isinstance(exc, WarmMiss):
        outcome.reason, outcome.detail = exc.reason, exc.detail
    else:  # a store that does not answer, a link in the cache: still never the pod's failure
        reason = "unsafe" if isinstance(exc, UnsafeCacheEntry) else "unavailable"
        outcome.reason, outcome.detail = reason, str(exc)
    log.warning("warm start miss for %s: %s: %s", outcome.tuple_id, outcome.reason,
                outcome.detail)
    return outcome


def policy_or_miss(store: Store, channel: str | None, tuple_id: str,
                   gpu: str | None) -> WarmTrust | WarmOutcome:
    """The channel's warm-start rule from the store's policy in force, or (policy missing or
    malformed) a miss: the weights pull and the pod go on, cold."""
    from k3artifacts.policy.record import in_force

    try:
        return warm_trust(in_force(store), channel)
    except K3AError as exc:
        outcome = WarmOutcome(tuple_id, gpu, "?", ok=False)
        outcome.reason, outcome.detail = "no-policy", str(exc)
        log.warning("warm start miss for %s: no-policy: %s", tuple_id, exc)
        return outcome


def _layout(release: ReleaseTuple, tp: int | None) -> tuple[int, int, str]:
    want_tp, pp = tuple_layout(release)
    tp = tp or want_tp
    return tp, pp, f"tp{tp}" + (f"-pp{pp}" if pp > 1 else "")


def fetch(store: Store, release: ReleaseTuple, root: Path, *, gpu: str | None,
          trust: WarmTrust, tp: int | None = None) -> WarmOutcome:
    """Pull the tuple's artifact for ``gpu`` into the node cache at ``root``, verified."""
    tp, pp, layout = _layout(release, tp)
    outcome = WarmOutcome(release.id, gpu, layout, ok=False)
    try:
        trusted = check_manifest(store, release, gpu=gpu, tp=tp, pp=pp, trust=trust)
        result = pull_warm(store, release, trusted, root)
    except (WarmMiss, K3AError, OSError) as exc:
        return _miss(outcome, exc)
    outcome.ok, outcome.path, outcome.files, outcome.bytes = True, result.path, result.files, \
        result.bytes
    outcome.already_present = result.already_present
    return outcome


def prepare(store: Store, release: ReleaseTuple, root: Path, into: Path, *, gpu: str | None,
            trust: WarmTrust, tp: int | None = None, pull: bool = True) -> WarmOutcome:
    """At a server's start: hold the store's manifest to the policy again, pull the artifact
    if the node lacks it (``pull``), and copy it, re-verified, into ``into/<cache>/``.
    ``env`` always names the cache directories (empty on a miss)."""
    tp, pp, layout = _layout(release, tp)
    outcome = WarmOutcome(release.id, gpu, layout, ok=False)
    try:
        trusted = check_manifest(store, release, gpu=gpu, tp=tp, pp=pp, trust=trust)
        if pull:
            pull_warm(store, release, trusted, root)
        used: WarmUse = use_warm(root, trusted, into)
    except (WarmMiss, K3AError, OSError) as exc:
        outcome.env = use_cold(into)
        return _miss(outcome, exc)
    outcome.env = used.env
    if not used.used:
        outcome.reason, outcome.detail = used.reason, used.detail
        log.warning("warm start miss for %s: %s: %s", release.id, used.reason, used.detail)
        return outcome
    outcome.ok, outcome.path, outcome.files, outcome.bytes = True, str(into), used.files, \
        used.bytes
    return outcome
