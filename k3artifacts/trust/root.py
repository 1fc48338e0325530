"""The root of trust: the identities whose signatures make a policy version the store's, and
how many of them a change needs. Pinned by each client outside the store (:mod:`.pins`),
changed only by a rotation signed under the root it replaces.

A root is a small document::

    {"schema_version": 1, "version": 2, "threshold": 2, "previous": "<fingerprint of v1>",
     "store_id": "<32 hex, random, made with root v1>",
     "identities": {"alice": [{"pem": "..."}], "bob": [{"pem": "...", "kms": "arn:..."}]}}

Its **store id** is what makes this store's root another one than a store seeded by the same
people: every record signed here names it (:mod:`.envelope`), so one copied from another store
is refused. It is made at random with root v1 and kept by every rotation; a root made before
ids has none (the field is absent, so its fingerprint is what it was) until a rotation gives it
one (:mod:`.storeid`).

Its **fingerprint** is the sha256 of its canonical JSON: what people compare out of band when
a second machine pins the same root (``k3a trust init --fingerprint``).

* A change that is provably stricter needs one root identity's signature; any other change
  needs ``threshold`` distinct root identities (:meth:`Root.authorize`). A root of two or more
  identities has a threshold of at least two. A root of one identity (a store's first use, by
  one person) can only have a threshold of one: ``k3a trust show`` says so, and adding a
  second identity is the way out.
* Version N+1 is trusted only when it names version N's fingerprint as ``previous`` and is
  signed by at least version N's threshold of version N's identities
  (:func:`verify_root_rotation`). Rotations are stored create-once at
  ``releases/trust/root/<version>.json`` so every client walks the same chain from its pin.
"""

from __future__ import annotations

import secrets
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import (
    HistoryRewound,
    TrustRootError,
    UntrustedRecord,
    UsageError,
    plain_validation_errors,
)
from k3artifacts.trust.envelope import Bound, parse_record, sign_record, verify_record
from k3artifacts.trust.identities import KeyEntry, Keyring, check_names, check_unique_keys
from k3artifacts.trust.keys import RecordSigner, signer_key_id
from k3artifacts.trust.storage import RecordReader

ROOT_PREFIX = "releases/trust/root/"
PROPOSALS_PREFIX = "releases/trust/proposals/"
KIND = "root"
VERSION_WIDTH = 10
STORE_ID = r"^[0-9a-f]{32}$"


def new_store_id() -> str:
    return secrets.token_hex(16)


def root_key(version: int) -> str:
    return f"{ROOT_PREFIX}{version:0{VERSION_WIDTH}d}.json"


def proposal_key(version: int) -> str:
    """Where a rotation waits for more signatures than its proposer's (replaceable: nothing
    trusts it until it is published at :func:`root_key`)."""
    return f"{PROPOSALS_PREFIX}root-{version:0{VERSION_WIDTH}d}.json"


class Root(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    version: int = Field(ge=1)
    threshold: int = Field(ge=1)
    #: The fingerprint of the root this one replaced; None for a first root.
    previous: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    identities: dict[str, list[KeyEntry]] = Field(min_length=1)
    #: The store's id (module doc); None for a root made before stores had ids. Left out of
    #: the document when None, so such a root keeps its fingerprint.
    store_id: str | None = Field(default=None, pattern=STORE_ID,
                                 exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _sound(self) -> Root:
        check_names(self.identities)
        if any(not keys for keys in self.identities.values()):
            raise ValueError("every root identity needs a key")
        check_unique_keys((n, k) for n, keys in self.identities.items() for k in keys)
        count = len(self.identities)
        if self.threshold > count:
            raise ValueError(f"a threshold of {self.threshold} with {count} root identities "
                             "could never be met")
        if self.threshold < min(2, count):
            raise ValueError(f"{count} root identities need a threshold of at least 2: a change "
                             "that is not provably stricter needs two identities")
        if (self.version == 1) != (self.previous is None):
            raise ValueError("a first root names no previous root, and only a first root")
        return self

    @cached_property
    def fingerprint(self) -> str:
        return canonical_digest(self)

    def keyring(self) -> Keyring:
        return Keyring.of((name, keys, frozenset()) for name, keys in self.identities.items())

    @property
    def bound(self) -> Bound:
        """What a record signed by this root's identities for its own place is bound to."""
        return Bound(self.store_id)

    def identity_of(self, signer: RecordSigner) -> str | None:
        """The root identity ``signer``'s key belongs to, if any."""
        trusted = self.keyring().get(signer_key_id(signer))
        return None if trusted is None else trusted.identity

    def require_identity(self, signer: RecordSigner, *, only: str, hint: str) -> str:
        """The root identity ``signer``'s key belongs to; TrustRootError (exit 9) otherwise,
        saying what ``only`` root identities do."""
        me = self.identity_of(signer)
        if me is None:
            raise TrustRootError(
                f"your key {signer_key_id(signer)[:16]} is not one of root v{self.version}'s "
                f"identities ({', '.join(self.identities)}): only they {only}", hint=hint)
        return me

    def needs(self, *, stricter: bool) -> int:
        return 1 if stricter else self.threshold

    def authorize(self, signers: frozenset[str], *, stricter: bool, key: str) -> frozenset[str]:
        """The root identities among ``signers``; UntrustedRecord ``threshold`` when fewer
        than the change needs."""
        counted = signers & set(self.identities)
        need = self.needs(stricter=stricter)
        if len(counted) < need:
            what = ("a provably stricter change" if stricter
                    else "a change that is not provably stricter")
            raise UntrustedRecord(
                key, "threshold",
                f"{what} needs {need} root identit{'y' if need == 1 else 'ies'} of root "
                f"v{self.version}; signed by {sorted(counted) or 'none'}",
                hint="another root identity adds its signature (`k3a trust rotate --cosign` for "
                "a root change)")
        return counted


def _made(**fields: object) -> Root:
    try:
        return Root.model_validate(fields)
    except ValidationError as exc:
        raise UsageError(f"not a sound root: {plain_validation_errors(exc)}",
                         hint="a threshold is at least 2 (1 for a single identity) and at most "
                         "the number of root identities") from None


def first_root(identities: dict[str, list[KeyEntry]], threshold: int | None = None,
               store_id: str | None = None) -> Root:
    """Version 1 of a root: ``threshold`` defaults to two where there are two identities;
    ``store_id`` to a new random one (a new store)."""
    return _made(version=1, threshold=threshold or min(2, len(identities)),
                 identities=identities, store_id=store_id or new_store_id())


def next_root(old: Root, *, add: dict[str, list[KeyEntry]] | None = None,
              remove: list[str] | None = None, threshold: int | None = None) -> Root:
    """The rotation of ``old``: identities added (a name already there gets the keys given,
    replacing its own), removed, and the threshold (default: kept, raised to two when the
    root grows to two identities). The store id is kept; a root older than ids gets one
    (:mod:`.storeid`)."""
    identities = {n: k for n, k in old.identities.items() if n not in set(remove or ())}
    identities.update(add or {})
    count = len(identities)
    chosen = threshold or min(max(old.threshold, min(2, count)), count)
    return _made(version=old.version + 1, threshold=chosen, previous=old.fingerprint,
                 identities=identities, store_id=old.store_id or new_store_id())


def sign_root(root: Root, signer: RecordSigner, identity: str) -> bytes:
    """``root`` signed for its place in the root chain (a proposal waiting for signatures is
    signed for that place too, wherever it waits)."""
    return sign_record(key=root_key(root.version), kind=KIND, body=root, signer=signer,
                       identity=identity, store_id=root.store_id)


def _root_body(body: dict, key: str) -> Root:  # type: ignore[type-arg]
    try:
        return Root.model_validate(body)
    except ValidationError as exc:
        raise UntrustedRecord(key, "malformed", f"not a root: {exc.errors()[0]['msg']}") from None


def stored_root(data: bytes, key: str) -> Root:
    """The root a stored record claims to hold, before any signature is checked: only to be
    compared with a fingerprint or a pin, never trusted by itself."""
    return _root_body(parse_record(data, key=key).body, key)


def verify_root_rotation(old: Root, data: bytes, *,
                         complete: bool = True) -> tuple[Root, frozenset[str]]:
    """The root ``data`` holds, trusted as the successor of ``old``, with the old root's
    identities that signed it. ``complete``: it must carry old's threshold of them (a
    proposal still collecting signatures is checked with ``complete=False``: one suffices)."""
    key = root_key(old.version + 1)
    # A root names its own store id in what is signed (the one it holds).
    verified = verify_record(data, key=key, kind=KIND, keyring=old.keyring(), roles=None,
                             bound=stored_root(data, key).bound)
    new = _root_body(verified.body, key)
    if new.version != old.version + 1 or new.previous != old.fingerprint:
        raise UntrustedRecord(
            key, "root-mismatch",
            f"root v{new.version} follows {str(new.previous)[:16]}, not v{old.version} "
            f"({old.fingerprint[:16]})")
    if old.store_id is not None and new.store_id != old.store_id:
        raise UntrustedRecord(key, "another-store",
                              f"root v{new.version} names store {new.store_id}; the store's id "
                              f"is {old.store_id}, and an id never changes")
    if complete:
        old.authorize(verified.signers, stricter=False, key=key)
    return new, verified.signers & set(old.identities)


def verify_first_root(data: bytes, fingerprint: str) -> Root:
    """The store's root v1, trusted only if its fingerprint is the one given (compared out of
    band with someone who pinned it), and signed by one of its own identities."""
    key = root_key(1)
    claimed = stored_root(data, key)
    if claimed.fingerprint != fingerprint:
        raise UntrustedRecord(key, "root-mismatch",
                              f"the store's root v1 has fingerprint {claimed.fingerprint}, not "
                              f"{fingerprint}",
                              hint="check the fingerprint with whoever pinned the store's root "
                              "(`k3a trust show`); never pin one you cannot compare")
    verified = verify_record(data, key=key, kind=KIND, keyring=claimed.keyring(), roles=None,
                             bound=claimed.bound)
    return _root_body(verified.body, key)


def walk_rotations(store: RecordReader, pinned: Root, *, held: bool = False) -> list[Root]:
    """Every root after ``pinned`` that the store holds, each verified under the one before:
    the last is the root in force. Refuses a store whose root at the pinned version is another
    one (``root-mismatch``), or, where the store is known to have ``held`` it, lacks it
    (:class:`~k3artifacts.errors.HistoryRewound`: a store set back behind this client's pin)."""
    found = store.read(root_key(pinned.version))
    if found is None and held:
        newer = [k for k in store.list_keys(ROOT_PREFIX) if k.endswith(".json")]
        raise HistoryRewound(root_key(pinned.version), "rewound", "the store's root",
                             f"v{pinned.version} ({pinned.fingerprint[:12]})",
                             f"{len(newer)} root(s), not v{pinned.version}")
    if found is not None:
        stored = stored_root(found.data, root_key(pinned.version))
        if stored.fingerprint != pinned.fingerprint:
            raise UntrustedRecord(
                root_key(pinned.version), "root-mismatch",
                f"the store's root v{pinned.version} is {stored.fingerprint[:16]}, this client "
                f"pins {pinned.fingerprint[:16]}",
                hint="someone replaced the store's root, or this client pinned another store's: "
                "compare `k3a trust show` with a colleague's before anything else")
    chain: list[Root] = []
    current = pinned
    while (found := store.read(root_key(current.version + 1))) is not None:
        current, _ = verify_root_rotation(current, found.data)
        chain.append(current)
    return chain
