"""The store's policy: the one copy that judges promotions, a hash-chained history of changes
each signed by root identities (:mod:`k3artifacts.trust.chain`, :mod:`k3artifacts.trust.root`).

Keys (same under every store)::

    releases/policy/documents/<sha256>.json        a PolicyDocument, canonical, create-once
    releases/policy/current.json                   the head: the newest change, as signed
                                                   (compare-and-swap)
    releases/policy/changes/<version:010d>.json    one signed change per version (create-once):
                                                   {"seq", "previous": <digest of the change
                                                   before>, "entry": PolicyChange}
    releases/policy/checkpoint.json                a root identity's checkpoint
    releases/policy/base.json                      changes older than signing, re-signed
                                                   (migration)
    releases/policy/proposals/<request-id>.json    a change collecting root signatures
                                                   (:mod:`.proposal`; nothing trusts it)

A change binds its document by digest and names the root it was signed under
(``root_version``). Every reader (``policy show``, ``gates``, ``promote``, ``render``, the
channel histories through the identities they trust) verifies the chain from this client's
pinned root, following the store's verified rotations (:func:`~k3artifacts.trust.pins.
trusted_roots`), to its start, and each change's authority (:func:`_authorize`): signed by
the root's threshold of its identities, or, where it is provably stricter than the version
before (:func:`~.loosening.loosening` finds nothing), by one. A first version (``seed``) and
the first signed version after a history older than signing (``migrate``) need one root
identity. The roots a history names only move forward. A pointer set to a proposed document
that was never signed into force, a change edited, removed or forked, a root that never was:
refused by name (:class:`~k3artifacts.errors.UntrustedRecord`, exit 4).

The first version is seeded from the packaged defaults (or ``k3a policy init --from DIR``) by
the store's first move, whose key becomes the root on first use (:mod:`.acting`). After that a
version changes only by ``k3a policy propose DIR`` and ``k3a policy apply REQUEST``
(:mod:`.change`). A local policy directory never judges anything itself.

**Stores older than signing** hold an unsigned pointer (``{"version", "digest", "change"}``)
and unsigned changes. While the store has no root of trust and this client pins none, they
are read as found where their policy says so (``unsigned.read_before_migration``, default
true): nothing is more trusted than it was, and no move is made on them
(:class:`~.acting.MigrationNeeded`). ``k3a trust migrate`` re-signs the changes as found into
the history's base (``releases/policy/base.json``, :class:`~k3artifacts.trust.chain.Base`),
each marked with the root whose identity signed it (``migrated_under``), and signs the next
version into force (:mod:`k3artifacts.migration.policy`): from then on the history is signed
throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.bundled import POLICIES
from k3artifacts.canonical import canonical_json
from k3artifacts.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    HistoryRewound,
    StoredRecordRefused,
    UntrustedRecord,
    plain_validation_errors,
)
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.policy.freshness import Freshness, renew
from k3artifacts.policy.freshness import check as check_freshness
from k3artifacts.policy.loosening import loosening
from k3artifacts.policy.results import policy_label
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import enrol, heads
from k3artifacts.trust.chain import (
    UNSIGNED_HINT,
    Chain,
    ChainEntry,
    ChainLayout,
    Mark,
    append,
    verify_chain,
)
from k3artifacts.trust.envelope import is_unsigned
from k3artifacts.trust.identities import Identities, Keyring, identities_yaml
from k3artifacts.trust.keys import RecordSigner
from k3artifacts.trust.pins import Roots, load_pin, trusted_roots
from k3artifacts.trust.root import root_key

PREFIX = "releases/policy/"
POINTER_KEY = f"{PREFIX}current.json"
CHECKPOINT_KEY = f"{PREFIX}checkpoint.json"
VERSION_WIDTH = 10
KIND = "policy-change"

LAYOUT = ChainLayout(name="the store's policy", pointer_key=POINTER_KEY,
                     entries_prefix=f"{PREFIX}changes/", entry_kind=KIND,
                     checkpoint_key=CHECKPOINT_KEY, base_key=f"{PREFIX}base.json")


def document_key(digest: str) -> str:
    return f"{PREFIX}documents/{digest}.json"


def change_key(version: int) -> str:
    return LAYOUT.entry_key(version)


class PolicyChange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    version: int = Field(ge=1)
    digest: str
    previous_digest: str | None = None
    #: ``migrate``: the first signed version after a history older than signing.
    action: Literal["seed", "change", "migrate"]
    by: Actor
    at: datetime
    why: str | None = None
    #: The proposal (an approval request) this change applied.
    request_id: str | None = None
    proposed_by: Actor | None = None
    #: Older changes: who approved a loosening one. Signed changes name their assent by the
    #: root identities' signatures instead.
    approved_by: Actor | None = None
    #: What the change loosened, as judged by the version it replaced.
    loosens: list[str] = Field(default_factory=list)
    #: The root whose identities signed it (None: a change older than signing).
    root_version: int | None = Field(default=None, ge=1)
    #: A change older than signing, re-signed as found by a root identity of this root
    #: version (``k3a trust migrate``): it vouches for the change, it did not make it.
    migrated_under: int | None = Field(default=None, ge=1)


class LegacyPointer(BaseModel):
    """The pointer a store older than signing holds: the version in force and its change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    version: int = Field(ge=1)
    digest: str
    change: PolicyChange


class CorruptPolicy(StoredRecordRefused):
    """A policy record that does not parse or does not match its digest: the store was
    edited behind k3a's back."""

    hint = "inspect the key named; policy records are written only by `k3a policy`"


@dataclass(frozen=True)
class Recorded:
    """One version of the store's policy as its history holds it."""

    change: PolicyChange
    #: The root identities whose signatures put it in force (none: older than signing,
    #: re-signed by a migration).
    signers: frozenset[str]


@dataclass(frozen=True)
class InForce:
    """The policy that judges: its version (0: the packaged defaults, not yet seeded into
    this store), digest and document; the verified history it heads, and the store's roots
    as this client trusts them (both None for version 0 and for a store older than
    signing, read as found: ``legacy``)."""

    version: int
    digest: str
    document: PolicyDocument
    chain: Chain[PolicyChange] | None = None
    roots: Roots | None = None
    #: The store predates signed records (no root in it, none pinned here): its histories
    #: are read as found, where the policy says so, and nothing is moved on it.
    legacy: bool = False
    #: Every version's document digest, by version, as the history holds them. Keyed by
    #: version: a change that restores an earlier text puts one digest in force twice.
    digests: dict[int, str] = field(default_factory=dict)
    #: The store's signed freshness head, checked (None where the policy asks for none).
    freshness: Freshness | None = None

    def __post_init__(self) -> None:
        self.document.shown_as(f"policy v{self.version} ({self.digest[:12]})" if self.version
                               else f"the packaged policy ({self.digest[:12]})")

    def label(self) -> str:
        return policy_label(self.version, self.digest)


def channel_section(store: RecordStore, channel: str, section: str, example: str) -> Any:
    """``section`` (``traffic``, ``infrastructure``) of ``channel`` in the store's policy in
    force; ConfigError (exit 9), saying how to propose one, when the channel has none."""
    policy = in_force(store)
    chan = policy.document.gates.channels.get(channel)
    found = None if chan is None else getattr(chan, section)
    if found is None:
        raise ConfigError(f"channel {channel!r} has no {section} policy in the store's policy "
                          f"({policy.label()})",
                          hint=f"propose one under the channel (`{section}: {example}`) with "
                          "`k3a policy propose DIR`")
    return found


def read_document(store: RecordStore, digest: str) -> PolicyDocument:
    """The policy document ``digest`` names. Every digest read here comes from a record of the
    store (a change, a request, a pointer), so a document that is missing is a stored record
    refused (exit 4), not an unknown name."""
    key = document_key(digest)
    found = store.read(key)
    if found is None:
        raise CorruptPolicy(f"{key} is missing from {store.url}, though a record of the "
                            "store names it")
    try:
        document = PolicyDocument.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptPolicy(f"{key} is malformed: {exc.errors()[0]['msg']}") from None
    if document.digest != digest:
        raise CorruptPolicy(f"{key} holds a document with digest {document.digest}")
    return document


def packaged_document() -> PolicyDocument:
    return PolicyDocument.from_dir(POLICIES)


def _legacy_pointer(data: bytes) -> LegacyPointer:
    try:
        return LegacyPointer.model_validate_json(data)
    except ValidationError as exc:
        raise UntrustedRecord(POINTER_KEY, "malformed", "neither a signed change nor a pointer "
                              f"older than signing: {exc.errors()[0]['msg']}") from None


def unsigned_pointer(data: bytes) -> bool:
    """Whether the policy pointer ``data`` is unsigned (a store older than signing, or
    written by hand)."""
    return is_unsigned(data, key=POINTER_KEY)


def _keyring_for(roots: Roots) -> Any:
    def keyring(entry: dict[str, Any]) -> Keyring:
        version = entry.get("root_version") or entry.get("migrated_under")
        if not isinstance(version, int):
            raise UntrustedRecord(POINTER_KEY, "malformed", "a signed change names no root")
        return roots.at(version, key=POINTER_KEY).keyring()
    return keyring


def _authorize(store: RecordStore, chain: Chain[PolicyChange], roots: Roots) -> None:
    """Each signed change's authority: its place, the document before it, the root it names
    (never behind the one before), and that root's threshold of signatures, or one where the
    change is provably stricter than the version before it. A change older than signing
    (``migrated_under``, only in the history's base) needs one root identity."""
    before: ChainEntry[PolicyChange] | None = None
    floor = 0
    for entry in chain.entries:
        change, key = entry.entry, change_key(entry.seq)
        if (change.migrated_under is not None) != entry.in_base:
            raise UntrustedRecord(key, "edit", f"version {change.version} says it is older "
                                  "than signing where it is not in the history's base, or the "
                                  "other way round")
        if change.migrated_under is not None:
            floor = change.migrated_under
            roots.at(floor, key=key).authorize(entry.signers, stricter=True, key=key)
            before = entry
            continue
        if change.version != entry.seq or change.previous_digest != (
                None if before is None else before.entry.digest):
            raise UntrustedRecord(key, "edit", f"change #{entry.seq} says it is version "
                                  f"{change.version} after {str(change.previous_digest)[:12]}, "
                                  "which is not the version before it")
        assert change.root_version is not None  # the keyring needs one to check the signature
        if change.root_version < floor:
            raise UntrustedRecord(key, "root-mismatch", f"version {change.version} is signed "
                                  f"under root v{change.root_version}, after a version signed "
                                  f"under root v{floor}")
        floor = change.root_version
        root = roots.at(change.root_version, key=key)
        first = change.action == "seed" and before is None
        migrated = change.action == "migrate" and before is not None and before.in_base
        if change.action != "change" and not (first or migrated):
            raise UntrustedRecord(key, "edit", f"version {change.version} is a "
                                  f"{change.action}, which it can only be first")
        short = len(entry.signers & set(root.identities)) < root.threshold
        one_is_enough = first or migrated or (short and before is not None and not loosening(
            read_document(store, before.entry.digest), read_document(store, change.digest)))
        root.authorize(entry.signers, stricter=one_is_enough, key=key)
        before = entry


def _unrooted(store: RecordStore) -> bool:
    """No root of trust in the store, and none pinned for it here: whatever it holds
    predates signing (a first-use seed makes one before anything is signed)."""
    return load_pin(store.url) is None and store.read(root_key(1)) is None


def _as_legacy(store: RecordStore, found_data: bytes) -> InForce:
    """A store older than signing, read as found (module doc)."""
    pointer = _legacy_pointer(found_data)
    document = read_document(store, pointer.digest)
    if not document.gates.unsigned.read_before_migration:
        raise UntrustedRecord(POINTER_KEY, "unsigned", "the store's policy predates signed "
                              "records, and says not to read it until it is migrated",
                              hint=UNSIGNED_HINT)
    return InForce(pointer.version, pointer.digest, document, legacy=True)


def in_force(store: RecordStore) -> InForce:
    """The store's policy in force, its history verified (module doc), and the store's
    freshness head where the policy asks for one (:mod:`.freshness`: StaleStore once expired);
    the packaged defaults (version 0) while it has none."""
    policy = unchecked_freshness(store)
    if policy.chain is None or policy.roots is None or policy.chain.mark is None:
        return policy
    fresh = check_freshness(store, policy.document, policy.roots, policy.label(),
                            policy.chain.mark, LAYOUT.name,
                            {e.seq: e.digest for e in policy.chain.entries})
    return replace(policy, freshness=fresh)


def renewed(store: RecordStore, signer: RecordSigner,
            channels: Mapping[str, Mark] | None = None,
            records: Mapping[str, Mark] | None = None) -> InForce:
    """The policy in force after a move of ``signer``'s, the store's freshness head re-signed
    by it first where it may sign one (``channels``: the heads of channels it moved;
    ``records``: of tuples' record logs it verified)."""
    policy = unchecked_freshness(store)
    if policy.chain is not None and policy.roots is not None and policy.chain.mark is not None:
        renew(store, policy.document, policy.roots, signer, policy_head=policy.chain.mark,
              channels=channels or {}, records=records)
    return in_force(store)


def unchecked_freshness(store: RecordStore) -> InForce:
    """:func:`in_force` but for the freshness head: for the moves that re-sign it."""
    found = store.read(POINTER_KEY)
    if found is None:
        if store.read(change_key(1)) is not None:
            raise UntrustedRecord(POINTER_KEY, "rewound", f"{LAYOUT.name} has no head, but "
                                  "its log holds changes: the pointer was removed")
        seen = heads.seen(store.url, LAYOUT.name)
        if seen is not None:
            raise HistoryRewound(POINTER_KEY, "rewound", LAYOUT.name,
                                 f"v{seen.seq} ({seen.digest[:12]})", "no policy at all")
        document = packaged_document()
        return InForce(0, document.digest, document, legacy=_unrooted(store))
    if unsigned_pointer(found.data) and _unrooted(store):
        return _as_legacy(store, found.data)
    roots = trusted_roots(store)
    # Walked whole (a policy has a few versions, not a channel's thousands of moves): every
    # version's digest is what a channel entry's judge is looked up in.
    chain = verify_chain(store, LAYOUT, PolicyChange, keyring=_keyring_for(roots), roles=None,
                         bound=roots.bound, checkpoint_keyring=roots.current.keyring(),
                         last_seen=heads.seen(store.url, LAYOUT.name), full=True)
    _authorize(store, chain, roots)
    heads.remember(store.url, LAYOUT.name, chain.mark)
    head = chain.head
    assert head is not None
    return InForce(head.seq, head.entry.digest, read_document(store, head.entry.digest), chain,
                   roots, digests={e.seq: e.entry.digest for e in chain.entries})


def store_document(store: RecordStore, document: PolicyDocument) -> None:
    try:
        store.create(document_key(document.digest), canonical_json(document))
    except AlreadyExists:
        read_document(store, document.digest)  # same digest: same content, unless tampered


def seeding_document(document: PolicyDocument, acting: Acting) -> PolicyDocument:
    """``document`` as the first policy of a store ``acting`` seeds: naming the root's
    identities with every role but release where it names nobody else (its release
    identities and rules kept beside them); ConfigError (exit 9) when it names identities
    and none of them holds the seeder's key (the seeder could not act on it)."""
    assert acting.seeding is not None
    named = document.identities
    if not any(set(ident.roles) - {"release"} for ident in named.identities.values()):
        # A release key names who signs releases, not who acts on the store: the seeder
        # still needs an identity, or nobody could.
        taken = sorted(set(acting.seeding.identities.identities) & set(named.identities))
        if taken:
            raise ConfigError(
                f"the policy to seed names a release identity {', '.join(taken)}, the name "
                "first use gives you",
                hint="rename that release identity in its identities.yaml, then seed again")
        try:
            seeded = Identities(identities={**acting.seeding.identities.identities,
                                            **named.identities},
                                release_channels=named.release_channels)
        except ValidationError as exc:
            raise ConfigError(f"the policy to seed: {plain_validation_errors(exc)}",
                              hint="your key is one of its release identities': sign your "
                              "records with another (`k3a key show`)") from None
        return document.with_file(IDENTITIES_FILE, identities_yaml(seeded))
    if document.identities.keyring().get(acting.key_id) is None:
        raise ConfigError(
            f"the policy to seed names identities ({', '.join(document.identities.identities)})"
            f", none with your key {acting.key_id[:16]}: you could not act on it",
            hint="add yourself to its identities.yaml (`k3a key show --entry NAME` prints the "
            "entry), or seed without one: the root's identities are named with every role")
    return document


def _establish_root(store: RecordStore, acting: Acting) -> None:
    """The seeder's root in the store and pinned here: first use makes it; a team's root this
    client pins is published if the store has none yet."""
    seeding = acting.seeding
    assert seeding is not None
    if seeding.first_use:
        enrol.first_use(store, acting.signer, acting.name, seeding.root)
    elif seeding.root.version == 1 and store.read(root_key(1)) is None:
        enrol.publish_first_root(store, seeding.root, acting.signer, acting.name)


def seed(store: RecordStore, document: PolicyDocument, *, acting: Acting,
         why: str | None = None, now: datetime | None = None) -> InForce:
    """Record ``document`` as the store's first policy version, signed by ``acting`` as a
    root identity; only while it has none. First use: ``acting``'s key becomes the store's
    root (:mod:`.acting`)."""
    current = in_force(store)
    if current.version != 0 or acting.seeding is None:
        raise Conflict(
            f"{store.url} already has a policy ({current.label()}); a change is proposed and "
            "applied, never seeded over", hint="`k3a policy propose DIR`")
    document = seeding_document(document, acting)
    _establish_root(store, acting)
    roots = trusted_roots(store)
    store_document(store, document)
    change = PolicyChange(version=1, digest=document.digest, action="seed", by=acting.actor,
                          at=now or datetime.now(UTC), why=why or "first policy of this store",
                          root_version=roots.current.version)
    empty = verify_chain(store, LAYOUT, PolicyChange, keyring=roots.current.keyring(),
                         roles=None, bound=roots.bound)
    try:
        append(store, empty, change, signer=acting.signer, identity=acting.name)
    except Conflict:
        raise Conflict(f"{store.url} was given a policy by someone else meanwhile; nothing "
                       "was written", hint="`k3a policy show`") from None
    return renewed(store, acting.signer)


def ensure_seeded(store: RecordStore, *, acting: Acting,
                  document: PolicyDocument | None = None) -> InForce:
    """The policy in force, seeding ``document`` (default: the packaged defaults) first if
    the store has none: a move is always judged by, and records, a version the store holds."""
    current = in_force(store)
    if current.version != 0:
        return current
    try:
        return seed(store, document or current.document, acting=acting,
                    why="seeded from the packaged defaults")
    except Conflict:
        return in_force(store)  # another mover seeded it first


def _legacy_changes(store: RecordStore, policy: InForce) -> list[Recorded]:
    out = []
    for version in range(1, policy.version):
        found = store.read(change_key(version))
        if found is None:
            raise CorruptPolicy(f"{change_key(version)} is missing from {store.url}")
        try:
            change = PolicyChange.model_validate_json(found.data)
        except ValidationError as exc:
            raise CorruptPolicy(f"{change_key(version)} is malformed: "
                                f"{exc.errors()[0]['msg']}") from None
        out.append(Recorded(change, frozenset()))
    pointer = _legacy_pointer(store.read(POINTER_KEY).data)  # type: ignore[union-attr]
    return [*out, Recorded(pointer.change, frozenset())]


def changes(store: RecordStore) -> list[Recorded]:
    """Every recorded version of the store's policy, oldest first (the one in force last,
    even if its mover died before logging it), with the root identities that signed each."""
    policy = in_force(store)
    if policy.version == 0:
        return []
    if policy.legacy:
        return _legacy_changes(store, policy)
    assert policy.chain is not None
    return [Recorded(e.entry, frozenset() if e.in_base else e.signers)
            for e in policy.chain.entries]
