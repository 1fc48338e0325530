"""The root of trust this client pins for each store, kept outside the store.

``$XDG_CONFIG_HOME/k3artifacts/trust/<first 32 hex of sha256(store URL)>.json``::

    {"schema_version": 1, "store": "s3://bucket/k3a", "how": "init",
     "pinned_at": "2026-...", "root": {...the Root, :mod:`.root`...}}

Keyed by the store's URL as this client names it, never by anything the store says about
itself: a store that chose its own key could pose as one this client had never seen. (A store
reached by two URLs, a file store mounted at two paths, has a pin for each.) The file is
written 0644 in a 0700 directory and refused when malformed, when it names another store, or
when another account could have written it (:func:`k3artifacts.trust.localfiles.problem`).

A pin only moves forward: :func:`follow` takes the rotations the store holds, each verified
under the root before it, and pins the last. A store whose roots were deleted or rewound cannot
take the pin back, and one whose root at the pinned version differs is refused.

The verifier of a pod pins the same way: :func:`config_map_files` is the pin as a ConfigMap
to mount at ``$XDG_CONFIG_HOME/k3artifacts/trust`` (mounted files belong to root and are not
writable by the pod's user, which the loader accepts).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import TrustRootError, UntrustedRecord
from k3artifacts.settings import config_home
from k3artifacts.trust import storeid
from k3artifacts.trust.envelope import Bound
from k3artifacts.trust.localfiles import private_dir, read_store_file, write_replacing
from k3artifacts.trust.root import Root, root_key, stored_root, walk_rotations
from k3artifacts.trust.storage import RecordReader

#: How a root came to be pinned: ``first-use`` (this client seeded the store's first policy),
#: ``init`` (``k3a trust init --root``), ``fingerprint`` (the store's root, checked against a
#: fingerprint given out of band), ``rotation`` (a later root, verified under the pinned one).
How = Literal["first-use", "init", "fingerprint", "rotation"]


class Pin(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    store: str
    how: How
    pinned_at: datetime
    root: Root


def trust_dir() -> Path:
    return config_home() / "trust"


def pin_name(store_url: str) -> str:
    return hashlib.sha256(store_url.encode()).hexdigest()[:32] + ".json"


def pin_path(store_url: str) -> Path:
    return trust_dir() / pin_name(store_url)


def load_pin(store_url: str) -> Pin | None:
    """This client's pin for ``store_url``; None when it has none."""
    path = pin_path(store_url)
    return read_store_file(path, Pin, store_url, what="pinned root",
                           why="choose which keys you trust (`k3a trust show` shows it after "
                           "fixing)", hint=f"remove {path} and pin {store_url}'s root again "
                           "(`k3a trust init`)")


def require_pin(store_url: str) -> Pin:
    pin = load_pin(store_url)
    if pin is None:
        raise TrustRootError(
            f"this client pins no root of trust for {store_url}",
            hint="ask a root identity of the store for its fingerprint (`k3a trust show`) and "
            "run `k3a trust init --fingerprint FP`, or pin the team's keys: `k3a trust init "
            "--root alice=alice.pub.pem --root bob=bob.pub.pem`")
    return pin


def save_pin(pin: Pin) -> Path:
    path = pin_path(pin.store)
    private_dir(path.parent)
    write_replacing(path, canonical_json(pin) + b"\n", mode=0o644)
    return path


def check_pinnable(store: RecordReader, root: Root) -> list[Root]:
    """``root`` and the rotations the store holds after it; refuses when this client already
    pins a root for the store that is not among them (never silently trust other keys)."""
    chain = [root, *walk_rotations(store, root)]
    existing = load_pin(store.url)
    if existing is not None and existing.root.fingerprint not in {r.fingerprint for r in chain}:
        raise TrustRootError(
            f"this client already pins root v{existing.root.version} "
            f"({existing.root.fingerprint[:16]}) for {store.url}; root v{root.version} "
            f"({root.fingerprint[:16]}) is another",
            hint=f"if you mean to trust other keys for this store, find out why first, then "
            f"remove {pin_path(store.url)} and pin again")
    return chain


def pin_root(store: RecordReader, root: Root, how: How, *,
             now: datetime | None = None) -> tuple[Pin, bool]:
    """Pin ``root`` for ``store`` (then the rotations the store holds after it); returns the
    pin and whether it changed. A client already pinning this root, or a later one it leads
    to, keeps its pin; one pinning another root is refused (:func:`check_pinnable`)."""
    chain = check_pinnable(store, root)
    existing = load_pin(store.url)
    if existing is not None:
        return follow(store, existing, now=now)
    pin = Pin(store=store.url, how=how if len(chain) == 1 else "rotation",
              pinned_at=now or datetime.now(UTC), root=chain[-1])
    save_pin(pin)
    return pin, True


def follow(store: RecordReader, pin: Pin, *, now: datetime | None = None) -> tuple[Pin, bool]:
    """``pin`` moved to the last root the store holds after it, each rotation verified. The
    pinned root itself must still be there, unless it is a team's first root pinned before
    the store's first use (:func:`~k3artifacts.trust.enrol.pin_keys`)."""
    held = not (pin.how == "init" and pin.root.version == 1)
    chain = walk_rotations(store, pin.root, held=held)
    if not chain:
        return pin, False
    moved = Pin(store=pin.store, how="rotation", pinned_at=now or datetime.now(UTC),
                root=chain[-1])
    try:
        save_pin(moved)
    except OSError:
        pass  # a pin mounted read-only (a pod's ConfigMap): followed again on each read
    return moved, True


@dataclass(frozen=True)
class Roots:
    """Every root of a store, v1 to the one in force, as this client trusts them: the one it
    pins and those after it, each verified under the one before (the pin follows them), and
    those before it, each the one its successor names by fingerprint."""

    pin: Pin
    by_version: dict[int, Root]
    #: The store every record read or signed here is bound to: the id of the root in force,
    #: and the records it held before it had one (:mod:`.storeid`).
    bound: Bound

    @property
    def current(self) -> Root:
        return self.pin.root

    def at(self, version: int, *, key: str) -> Root:
        """Root ``version``; UntrustedRecord ``root-mismatch`` for one this store never had."""
        found = self.by_version.get(version)
        if found is None:
            raise UntrustedRecord(key, "root-mismatch",
                                  f"signed under root v{version}; {self.pin.store}'s roots are "
                                  f"v1 to v{self.current.version}")
        return found


def trusted_roots(store: RecordReader) -> Roots:
    """The store's roots from this client's pin (TrustRootError, exit 9, without one),
    following rotations the store holds."""
    pin, _ = follow(store, require_pin(store.url))
    roots = {pin.root.version: pin.root}
    for version in range(pin.root.version - 1, 0, -1):
        key = root_key(version)
        found = store.read(key)
        if found is None:
            raise UntrustedRecord(key, "gap", f"root v{version} of {store.url} is missing "
                                  f"(this client pins v{pin.root.version})")
        older = stored_root(found.data, key)
        if older.fingerprint != roots[version + 1].previous:
            raise UntrustedRecord(key, "root-mismatch",
                                  f"root v{version} of {store.url} is not the one root "
                                  f"v{version + 1} follows")
        roots[version] = older
    return Roots(pin, roots, storeid.bound(store, roots, pin.root))


def config_map_files(pin: Pin) -> dict[str, str]:
    """The pin as ConfigMap data, to mount at ``$XDG_CONFIG_HOME/k3artifacts/trust``."""
    return {pin_name(pin.store): canonical_json(pin).decode() + "\n"}
