"""A signed record: one stored object holding the record and a DSSE envelope that binds it to
the key of the identity that made it.

Stored form (canonical JSON)::

    {"schema": "k3a.signed-record/v1",
     "kind": "review",
     "body": {...the record itself...},
     "envelope": {"payloadType": "application/vnd.in-toto+json",
                  "payload": "<base64 of the in-toto Statement v1 below>",
                  "signatures": [{"keyid": "<sha256 of the PEM public key>",
                                  "sig": "<base64 signature over the DSSE PAE>"}]}}

    statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": "<the record's store key>",
                              "digest": {"sha256": "<canonical digest of body>"}}],
                 "predicateType": "urn:k3artifacts:record:<kind>:v1",
                 "predicate": {"kind": "<kind>", "signer": "<identity that made it>",
                               "store": "<the store's id, as its root names it>"}}

The body stays readable in place (``jq .body``) while the signed payload stays small whatever
the body's size: what is signed is the statement naming the body's digest, never the body, so
a KMS key signs it RAW (KMS takes at most 4096 bytes). The subject names the store key, so a
record moved or copied elsewhere is refused there; the predicate names the store's id (its
root's :attr:`~k3artifacts.trust.root.Root.store_id`), so a record copied from another store
signed by the same identities is refused here (``another-store``). A store whose root predates
ids signs without one, as before: :class:`Bound` says how such records are read once the store
has an id. More signatures over the same payload may be added (:func:`add_signature`) where a
change needs more than one identity.

:func:`verify_record` checks, in order: the bytes parse, the kind is the one read, there are
signatures, each signature by a key the keyring trusts for one of the roles verifies, the
signed kind and store key are these, the body is the one signed, its maker signed it, and it
was signed for this store (:class:`Bound`).
Each failure is an :class:`~k3artifacts.errors.UntrustedRecord` naming the check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.canonical import (
    NotCanonical,
    canonical_digest,
    canonical_json,
    parse_json,
    to_plain,
)
from k3artifacts.errors import ConfigError, UntrustedRecord
from k3artifacts.signing.dsse import PAYLOAD_TYPE, STATEMENT_TYPE, pae
from k3artifacts.trust.identities import IDENTITY_NAME, Keyring
from k3artifacts.trust.keys import RecordSigner, key_id, verifies

SCHEMA = "k3a.signed-record/v1"
PREDICATE_TYPE = "urn:k3artifacts:record:{kind}:v1"
KIND = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
#: Store keys are at most this long (S3's limit): with the kind and the identity name bounded
#: too, a statement's encoding stays well under what KMS signs raw.
MAX_KEY = 1024
MAX_PAYLOAD = 3072


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Signature(_Strict):
    keyid: str = Field(pattern=r"^[0-9a-f]{64}$")
    sig: str


class Envelope(_Strict):
    payloadType: str  # noqa: N815 - DSSE's field names
    payload: str
    signatures: list[Signature]


class SignedRecord(_Strict):
    schema_: Literal["k3a.signed-record/v1"] = Field(alias="schema")
    kind: str = Field(pattern=KIND.pattern)
    body: dict[str, Any]
    envelope: Envelope

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", by_alias=True))


@dataclass(frozen=True)
class Bound:
    """The store a record is signed for, or read in: the id its root in force names (None: a
    root made before stores had ids, which signs and reads records naming none).

    A store given an id later (:mod:`k3artifacts.trust.storeid`) still holds records signed
    before it had one: ``earlier`` answers the digests of their signed statements, as a root
    identity vouched for them when the id came; a record naming no store is read there only
    if it is one of those. So a record signed without an id, here or in any other store, is
    never a way around the binding."""

    store_id: str | None
    earlier: Callable[[], frozenset[str]] | None = None

    def shown(self) -> str:
        return self.store_id or "none (its root predates store ids)"

    def vouches(self, payload: bytes) -> bool:
        return self.earlier is not None and statement_digest(payload) in self.earlier()


def statement_digest(payload: bytes) -> str:
    """What names one signed statement (its store key, kind, body digest, signer, store)."""
    return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True)
class Verified:
    """A record whose signatures checked out: its body (plain JSON values, for the caller's
    model), the identity that made it and every trusted identity that signed it."""

    key: str
    kind: str
    body: dict[str, Any]
    digest: str
    signer: str
    signers: frozenset[str]


def statement(key: str, kind: str, digest: str, signer: str,
              store_id: str | None) -> dict[str, Any]:
    if not KIND.match(kind):
        raise ValueError(f"{kind!r} is not a record kind")
    if len(key.encode()) > MAX_KEY:
        raise ValueError(f"store key of {len(key.encode())} bytes (at most {MAX_KEY})")
    if not IDENTITY_NAME.match(signer):
        raise ValueError(f"{signer!r} is not an identity name")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": key, "digest": {"sha256": digest}}],
        "predicateType": PREDICATE_TYPE.format(kind=kind),
        # A store whose root predates ids signs exactly as before: no ``store`` at all.
        "predicate": {"kind": kind, "signer": signer,
                      **({} if store_id is None else {"store": store_id})},
    }


def _signature(signer: RecordSigner, payload: bytes) -> Signature:
    message = pae(payload)
    sig = signer.sign(message)
    # Never store a signature that does not verify: a KMS or token answering with another key,
    # or a broken one, is caught here rather than by every reader later.
    if not verifies(signer.public_key, sig, message):
        raise ConfigError(f"the key {signer.source} made a signature that its own public key "
                          "does not verify; nothing was written",
                          hint="check the key (K3A_IDENTITY_KEY) and the service behind it")
    return Signature(keyid=key_id(signer.public_key), sig=base64.b64encode(sig).decode())


def sign_record(*, key: str, kind: str, body: BaseModel | dict[str, Any], signer: RecordSigner,
                identity: str, store_id: str | None) -> bytes:
    """The stored bytes of ``body`` as a record of ``kind`` at store ``key`` of the store
    ``store_id`` (its root's; None for a root older than ids), signed by ``signer`` as
    ``identity``."""
    plain = to_plain(body)
    payload = canonical_json(statement(key, kind, canonical_digest(plain), identity, store_id))
    assert len(payload) <= MAX_PAYLOAD, len(payload)  # bounded by statement()'s checks
    record = SignedRecord(schema=SCHEMA, kind=kind, body=plain, envelope=Envelope(
        payloadType=PAYLOAD_TYPE, payload=base64.b64encode(payload).decode(),
        signatures=[_signature(signer, payload)]))
    return record.to_bytes()


class _Duplicate(ValueError):
    """A JSON object naming one key twice: parsers disagree on which value wins."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Duplicate(f"a JSON object names {sorted({k for k in keys if keys.count(k) > 1})} "
                         "twice")
    return dict(pairs)


def parse_record(data: bytes, *, key: str) -> SignedRecord:
    """The record's structure, nothing trusted yet; refuses bytes that are not one."""
    try:
        plain = parse_json(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise UntrustedRecord(key, "unreadable", f"not UTF-8 ({exc.reason})") from None
    except (_Duplicate, NotCanonical) as exc:
        raise UntrustedRecord(key, "malformed", str(exc)) from None
    except ValueError as exc:
        raise UntrustedRecord(key, "unreadable", f"not JSON ({exc})") from None
    if not isinstance(plain, dict) or plain.get("schema") != SCHEMA:
        found = plain.get("schema") if isinstance(plain, dict) else type(plain).__name__
        raise UntrustedRecord(key, "unsigned" if isinstance(plain, dict) and found is None
                              else "malformed",
                              f"not a signed k3a record (schema {found!r}, not {SCHEMA})")
    try:
        return SignedRecord.model_validate(plain)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise UntrustedRecord(key, "malformed", f"{where}: {first['msg']}") from None


def is_unsigned(data: bytes, *, key: str) -> bool:
    """Whether ``data`` is a JSON object that is no signed record at all (one written before
    records were signed, or by hand), as opposed to a signed one or garbage."""
    try:
        parse_record(data, key=key)
    except UntrustedRecord as exc:
        return exc.reason == "unsigned"
    return False


def _payload(record: SignedRecord, key: str) -> bytes:
    envelope = record.envelope
    if envelope.payloadType != PAYLOAD_TYPE:
        raise UntrustedRecord(key, "malformed", f"payload type {envelope.payloadType!r}, not "
                              f"{PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(envelope.payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UntrustedRecord(key, "malformed", f"payload is not base64 ({exc})") from None
    if len(payload) > MAX_PAYLOAD:
        raise UntrustedRecord(key, "malformed", f"a payload of {len(payload)} bytes (records "
                              f"sign at most {MAX_PAYLOAD})")
    return payload


def _check_signatures(record: SignedRecord, payload: bytes, key: str, keyring: Keyring,
                      roles: Collection[str] | None) -> frozenset[str]:
    """The identities whose trusted, role-holding keys signed ``payload``."""
    if not record.envelope.signatures:
        raise UntrustedRecord(key, "unsigned", "the envelope holds no signature")
    message = pae(payload)
    signed: set[str] = set()
    lacking: dict[str, frozenset[str]] = {}
    unknown: list[str] = []
    for sig in record.envelope.signatures:
        trusted = keyring.get(sig.keyid)
        if trusted is None:
            unknown.append(sig.keyid)
            continue
        if roles is not None and not trusted.roles & set(roles):
            lacking[trusted.identity] = trusted.roles
            continue
        try:
            raw = base64.b64decode(sig.sig, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if not verifies(trusted.public_key, raw, message):
            raise UntrustedRecord(key, "tampered", f"the signature by {trusted.identity}'s key "
                                  f"{sig.keyid[:16]} does not match the statement it carries")
        signed.add(trusted.identity)
    if signed:
        return frozenset(signed)
    need = " or ".join(sorted(roles or ()))
    if lacking:
        who = "; ".join(f"{name} holds {', '.join(sorted(r)) or 'no role'}"
                        for name, r in sorted(lacking.items()))
        raise UntrustedRecord(key, "wrong-role", f"a {record.kind} needs a signer with the role "
                              f"{need}: {who}",
                              hint="the store's policy (identities.yaml) says who may sign "
                              "what; an identity gets a role by a policy change")
    raise UntrustedRecord(key, "untrusted-key", f"signed only by key(s) "
                          f"{', '.join(k[:16] for k in unknown)}, which the policy names for no "
                          "identity")


def _check_store(predicate: dict[str, Any], payload: bytes, key: str, bound: Bound) -> None:
    named = predicate.get("store")
    if named == bound.store_id:
        return
    if named is not None:
        raise UntrustedRecord(key, "another-store", f"signed for store {named}; this store's id "
                              f"is {bound.shown()}: a record copied from another store",
                              hint="sign it here (redo the move or the evidence against this "
                              "store); if this store should be that one, compare `k3a trust "
                              "show` with a colleague's pin before anything else")
    if not bound.vouches(payload):
        raise UntrustedRecord(key, "another-store", f"signed for no store, and not among the "
                              f"records store {bound.shown()} held when it was given its id: "
                              "copied from another store, or signed since by a client that "
                              "had not yet followed the root", hint="sign it here (redo the "
                              "move or the evidence against this store)")


def verify_record(data: bytes, *, key: str, kind: str, keyring: Keyring,
                  roles: Collection[str] | None, bound: Bound) -> Verified:
    """The record at store ``key``, of ``kind``, signed by keys of ``keyring`` holding one of
    ``roles`` (None: any key of the keyring, as a root's), for the store ``bound`` names."""
    record = parse_record(data, key=key)
    if record.kind != kind:
        raise UntrustedRecord(key, "wrong-kind", f"a {record.kind} record where a {kind} is read")
    payload = _payload(record, key)
    signers = _check_signatures(record, payload, key, keyring, roles)
    try:
        signed = json.loads(payload)
        subjects = [s for s in signed["subject"] if isinstance(s, dict)]
        predicate = signed["predicate"]
        ok = signed["_type"] == STATEMENT_TYPE and isinstance(predicate, dict)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UntrustedRecord(key, "malformed", "the signed payload is not an in-toto statement")
    if signed.get("predicateType") != PREDICATE_TYPE.format(kind=kind) \
            or predicate.get("kind") != kind:
        raise UntrustedRecord(key, "tampered", f"signed as {predicate.get('kind')!r}, stored as "
                              f"{kind!r}")
    names = [s.get("name") for s in subjects]
    if names != [key]:
        raise UntrustedRecord(key, "wrong-key", f"signed for {names}, read at {key!r}: the record "
                              "was moved or copied from elsewhere")
    digest = canonical_digest(record.body)
    if (subjects[0].get("digest") or {}).get("sha256") != digest:
        raise UntrustedRecord(key, "tampered", "the body is not the one signed (its digest "
                              f"{digest[:16]} differs from the statement's)")
    maker = predicate.get("signer")
    if maker not in signers:
        raise UntrustedRecord(key, "signer-mismatch", f"the statement names {maker!r} as its "
                              f"maker; signed by {sorted(signers)}")
    _check_store(predicate, payload, key, bound)
    return Verified(key, kind, record.body, digest, maker, signers)


def add_signature(data: bytes, *, key: str, signer: RecordSigner) -> bytes:
    """``data`` with one more signature, by ``signer``, over the payload it carries: a second
    identity's assent to exactly this record. Refuses a record whose body is not the one its
    statement names (the co-signer would vouch for other bytes than it was shown)."""
    record = parse_record(data, key=key)
    payload = _payload(record, key)
    try:
        digest = json.loads(payload)["subject"][0]["digest"]["sha256"]
    except (ValueError, KeyError, TypeError, IndexError):
        raise UntrustedRecord(key, "malformed", "the payload is not a k3a statement") from None
    if digest != canonical_digest(record.body):
        raise UntrustedRecord(key, "tampered", "the body is not the one its statement names")
    mine = key_id(signer.public_key)
    if any(s.keyid == mine for s in record.envelope.signatures):
        return record.to_bytes()
    envelope = record.envelope.model_copy(update={
        "signatures": [*record.envelope.signatures, _signature(signer, payload)]})
    return record.model_copy(update={"envelope": envelope}).to_bytes()
