"""Records signed by the identity that made them, read only through the store's policy in force.

Every record a gate, a move or a reader trusts (reviews, approval requests and decisions,
evaluations, image scans, preflights, traffic analyses, single-node rollback records, warm
manifests) is one signed record (:mod:`k3artifacts.trust.envelope`): its body, and a DSSE
envelope over a statement naming its store key and the body's digest, signed by the key of the
identity that made it. Here that format meets the store's policy:

* :data:`KIND_ROLES`: the role that signs each kind of record;
* :func:`create_signed`: a record made by an :class:`~.actor.Acting` that holds the role,
  created once (the first use of a store seeds its policy first, so the maker is in it);
* :class:`RecordTrust`: what the policy in force trusts: its identities' keys and roles, and
  how long records written before k3a signed them are still read
  (``unsigned.read_evidence_before``);
* :func:`read_signed` / :func:`parse_signed`: one stored record verified against it and
  parsed as its model.

Whatever fails (the bytes, the signature, the signer's role, the store key, the body's model,
the maker the body names) is an :class:`~k3artifacts.errors.UntrustedRecord` (exit 4) naming the
key and the check. A record that is absent is None: it never passes anything.

The identity a record counts for is the one whose key signed it: the body's maker field
(``reviewed_by``, ``recorded_by``, ``by``...) must name it (``signer-mismatch`` otherwise). A
record ``k3a trust migrate`` re-signed (:func:`resign_unsigned`) keeps the body it had, wrapped
in ``{"k3a_migrated": {"record": ...}}``, and counts for the identity that re-signed it: that
identity vouches for it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from k3artifacts.canonical import parse_json
from k3artifacts.errors import AlreadyExists, UntrustedRecord, plain_validation_errors
from k3artifacts.policy.actor import Acting, RoleRefused
from k3artifacts.policy.record import InForce, ensure_seeded, in_force
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.envelope import Bound, verify_record
from k3artifacts.trust.heads import Head
from k3artifacts.trust.identities import Keyring, Role
from k3artifacts.trust.pins import trusted_roots

#: Which roles may sign each kind of record. An approval request is signed with ``promote``
#: when it asks for a move, ``policy`` when it proposes a policy change (``policy/approvals``).
KIND_ROLES: dict[str, tuple[Role, ...]] = {
    "review": ("review",),
    "approval-request": ("promote", "policy"),
    "approval-decision": ("approve",),
    "evaluation": ("evaluate",),
    "scan": ("scan",),
    "preflight": ("preflight",),
    "traffic-analysis": ("traffic",),
    "single-node-rollback": ("promote",),
    "warm-manifest": ("warm",),
}
#: Kinds whose records written before k3a signed them are read in the policy's migration
#: window: evidence. An approval lives for one move; an old one is asked for again.
UNSIGNED_READABLE = frozenset(KIND_ROLES) - {"approval-request", "approval-decision"}
#: The body of a record ``k3a trust migrate`` re-signed: the unsigned one, kept as it was.
MIGRATED = "k3a_migrated"

UNSIGNED_HINT = ("records are written by k3a, signed by a key the store's policy trusts for "
                 "them: one written by hand counts for nothing. One written before k3a signed "
                 "records is re-signed by `k3a trust migrate` (or read while the policy's "
                 "unsigned.read_evidence_before has not passed)")

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Family(Generic[Model]):
    """One kind of record as stored: under which prefix, signed as which kind, parsed as which
    model, and which of its fields names its maker."""

    prefix: str
    kind: str
    model: type[Model]
    maker: str


@dataclass(frozen=True)
class RecordTrust:
    """What a policy trusts to have made records: its identities' keys (with their roles), the
    store they are signed for, and until when it reads evidence written before k3a signed
    records."""

    keyring: Keyring
    #: The policy, for messages (``the store's policy, version 3 (1f3a...)``).
    policy: str
    #: The store (its root's id) every record read here was signed for.
    bound: Bound
    unsigned_before: datetime | None = None
    #: The heads of tuples' record logs the store's signed freshness head names (by tuple
    #: id): a reader that never read a log is held to them.
    record_logs: Mapping[str, Head] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, policy: InForce) -> RecordTrust:
        """What ``policy`` trusts, in the store whose roots it was verified under (a policy
        without roots, the packaged one or one older than signing, names nobody who signs:
        no store id to bind to), held to the record logs its freshness head names."""
        document, freshness = policy.document, policy.freshness
        return cls(document.identities.keyring(), f"the store's policy, {policy.label()},",
                   Bound(None) if policy.roots is None else policy.roots.bound,
                   document.gates.unsigned.read_evidence_before,
                   {} if freshness is None else freshness.records)

    def reads_unsigned(self, kind: str, now: datetime | None = None) -> bool:
        return (kind in UNSIGNED_READABLE and self.unsigned_before is not None
                and (now or datetime.now(UTC)) < self.unsigned_before)


def record_trust(store: RecordStore) -> RecordTrust:
    """What the store's policy in force trusts (the packaged policy, naming nobody, while the
    store has none: no signed record verifies before the first move seeds it)."""
    return RecordTrust.of(in_force(store))


def _unsigned(data: bytes) -> dict[str, Any] | None:
    """The record as written before k3a signed records (plain JSON of its model), or None for
    anything else (a signed record, or bytes the envelope's parser names)."""
    try:
        plain = parse_json(data)
    except (UnicodeDecodeError, ValueError):
        return None  # the envelope's parser names what is wrong with it
    if isinstance(plain, dict) and "schema" not in plain and "envelope" not in plain:
        return plain
    return None


def claimed_body(data: bytes) -> dict[str, Any] | None:
    """What a stored record's body says, signed or not, verified or not: for keeping what it
    names (a warm manifest's blobs), never for trusting it. None for bytes that hold none."""
    plain = _unsigned(data)
    if plain is not None:
        return plain
    try:
        body = json.loads(data).get("body")
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    if isinstance(body, dict) and isinstance(body.get(MIGRATED), dict):
        body = body[MIGRATED].get("record")
    return body if isinstance(body, dict) else None


def _body(data: bytes, key: str, kind: str, trust: RecordTrust,
          roles: Collection[str] | None, now: datetime | None
          ) -> tuple[dict[str, Any], str | None, bool]:
    """(body, signer, migrated): the record's body once its signature checks out; signer None
    for an unsigned record the migration window lets in."""
    plain = _unsigned(data)
    if plain is not None:
        if not trust.reads_unsigned(kind, now):
            since = (f" (its migration window closed at {trust.unsigned_before:%Y-%m-%d %H:%M} "
                     "UTC)" if trust.unsigned_before and kind in UNSIGNED_READABLE else "")
            raise UntrustedRecord(key, "unsigned", f"no signature on this {kind} record "
                                  "(written by hand, or before k3a signed records); "
                                  f"{trust.policy} reads none{since}", hint=UNSIGNED_HINT)
        return plain, None, False
    verified = verify_record(data, key=key, kind=kind, keyring=trust.keyring,
                             roles=KIND_ROLES[kind] if roles is None else roles,
                             bound=trust.bound)
    body = verified.body
    if list(body) != [MIGRATED]:
        return body, verified.signer, False
    inner = body[MIGRATED]
    if kind not in UNSIGNED_READABLE or not isinstance(inner, dict) \
            or not isinstance(inner.get("record"), dict):
        raise UntrustedRecord(key, "malformed", f"a migrated {kind} record that holds no record "
                              "k3a trust migrate could have re-signed")
    return inner["record"], verified.signer, True


def _parsed(key: str, family: Family[Model], body: dict[str, Any]) -> Model:
    try:
        return family.model.model_validate(body)
    except ValidationError as exc:
        raise UntrustedRecord(key, "malformed", f"not a {family.kind} record: "
                              f"{plain_validation_errors(exc)}") from None


def _maker(record: BaseModel, field: str) -> str:
    value = getattr(record, field)
    return value if isinstance(value, str) else value.name


def made_by(record: BaseModel, family: Family[Any]) -> str:
    """The identity a record read through :func:`parse_signed` counts for."""
    return _maker(record, family.maker)


def parse_signed(data: bytes, *, key: str, family: Family[Model], trust: RecordTrust,
                 roles: Collection[str] | None = None, now: datetime | None = None) -> Model:
    """The record stored at ``key`` as ``family``'s model, signed by an identity ``trust``
    names with one of ``roles`` (default: the kind's). Its maker field names that identity."""
    body, signer, migrated = _body(data, key, family.kind, trust, roles, now)
    record = _parsed(key, family, body)
    if signer is None:
        return record  # unsigned, in the migration window: as written
    if migrated:
        # Re-signed by `k3a trust migrate`: it counts for the identity that vouched for it,
        # whatever name the unsigned record typed.
        if not isinstance(getattr(record, family.maker), str):
            raise UntrustedRecord(key, "malformed", f"a {family.kind} record cannot be migrated")
        return record.model_copy(update={family.maker: signer})
    named = _maker(record, family.maker)
    if named != signer:
        raise UntrustedRecord(key, "signer-mismatch", f"the record names {named!r} as its maker "
                              f"({family.maker}); it is signed by {signer}")
    return record


def read_signed(store: RecordStore, key: str, family: Family[Model], *,
                trust: RecordTrust | None = None,
                roles: Collection[str] | None = None) -> Model | None:
    """The record at ``key``, verified against ``trust`` (default: the store's policy in
    force); None when there is none."""
    found = store.read(key)
    if found is None:
        return None
    return parse_signed(found.data, key=key, family=family,
                        trust=trust or record_trust(store), roles=roles)


def store_id(store: RecordStore) -> str | None:
    """The id a record signed for ``store`` names: its root's, as this client pins it."""
    return trusted_roots(store).current.store_id


def require_role(by: Acting, kind: str, what: str,
                 roles: Collection[Role] | None = None) -> None:
    """RoleRefused (exit 9) unless ``by`` may sign ``kind`` records (one of ``roles``, default
    the kind's): what a move's plan checks before anything is read or asked."""
    allowed = tuple(KIND_ROLES[kind] if roles is None else roles)
    if not any(by.may(role) for role in allowed):
        held = ", ".join(sorted(by.roles)) or "no role"
        raise RoleRefused(f"{what} is signed with the role {' or '.join(allowed)}; {by.name} "
                          f"holds {held}")


def signed_bytes(store: RecordStore, key: str, family: Family[Model], record: Model, *,
                 by: Acting, roles: Collection[Role] | None = None) -> bytes:
    """The stored form of ``record`` at ``key``, signed by ``by`` (RoleRefused, exit 9, unless
    it holds the kind's role). A store with no policy yet is seeded by ``by`` first (first
    use), so the policy that reads the record names its maker."""
    require_role(by, family.kind, f"a {family.kind} record", roles)
    if by.seeding is not None:
        ensure_seeded(store, acting=by)
    return by.sign(key=key, kind=family.kind, body=record, store_id=store_id(store))


def create_signed(store: RecordStore, key: str, family: Family[Model], record: Model, *,
                  by: Acting, roles: Collection[Role] | None = None) -> tuple[Model, bool]:
    """``record`` signed by ``by`` (:func:`signed_bytes`) and created at ``key`` unless a
    record is there already: (the record the store holds, whether this call wrote it). A
    record there first is read through its signature like any other."""
    data = signed_bytes(store, key, family, record, by=by, roles=roles)
    try:
        store.create(key, data)
    except AlreadyExists:
        standing = read_signed(store, key, family, roles=roles)
        if standing is None:
            raise
        return standing, False
    return record, True


def unsigned_record(data: bytes, *, key: str, family: Family[Model]) -> Model | None:
    """The record at ``key`` as written before k3a signed records, parsed (never trusted: for
    :func:`resign_unsigned` to say what it would vouch for); None for a signed record.
    UntrustedRecord (malformed) for an unsigned one that is not its family's model."""
    plain = _unsigned(data)
    return None if plain is None else _parsed(key, family, plain)


def resign_unsigned(store: RecordStore, key: str, family: Family[Model], *, by: Acting,
                    now: datetime | None = None) -> bool:
    """Re-sign the record at ``key`` if it was written before k3a signed records: its body kept
    as it was, wrapped (:data:`MIGRATED`), signed by ``by``, who vouches for it, compare-and-
    swapped over the unsigned one (Conflict, exit 6, if it changed meanwhile). False when it
    is absent or signed already. One that is not its family's model is refused
    (UntrustedRecord): nothing malformed is vouched for."""
    found = store.read(key)
    if found is None or unsigned_record(found.data, key=key, family=family) is None:
        return False
    require_role(by, family.kind, f"re-signing a {family.kind} record")
    wrapped = {MIGRATED: {"record": _unsigned(found.data), "from": "unsigned",
                          "at": (now or datetime.now(UTC)).isoformat()}}
    store.replace(key, by.sign(key=key, kind=family.kind, body=wrapped,
                               store_id=store_id(store)), found.token)
    return True
