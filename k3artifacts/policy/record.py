"""The store's policy: the one copy that judges promotions, changed only by recorded moves.

Keys (same under every store)::

    releases/policy/documents/<sha256>.json        a PolicyDocument, canonical, create-once
    releases/policy/current.json                   which version is in force (compare-and-swap)
    releases/policy/changes/<version:010d>.json    one PolicyChange per version (create-once)

The first version is seeded from the packaged defaults (or, on a store with no policy yet,
``k3a policy init --from DIR``), recorded with who seeded it. After that a version changes only
by ``k3a policy propose DIR`` (an approval request carrying the proposed document's digest and
the digest it would replace) and ``k3a policy apply REQUEST`` (the moves: :mod:`.change`),
judged by the policy in force: a
change that loosens any channel (a gate, a channel or a signing requirement removed, a gate's
settings changed, typed names allowed) needs the approval of an identity other than the
proposer's (``k3a approve REQUEST``). A local policy directory never judges anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.bundled import POLICIES
from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, ConfigError, Conflict, K3AError, NotFound
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.policy.results import policy_label
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import enrol
from k3artifacts.trust.identities import identities_yaml
from k3artifacts.trust.root import root_key

PREFIX = "releases/policy/"
POINTER_KEY = f"{PREFIX}current.json"
VERSION_WIDTH = 10


def document_key(digest: str) -> str:
    return f"{PREFIX}documents/{digest}.json"


def change_key(version: int) -> str:
    return f"{PREFIX}changes/{version:0{VERSION_WIDTH}d}.json"


class PolicyChange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    version: int = Field(ge=1)
    digest: str
    previous_digest: str | None = None
    action: Literal["seed", "change"]
    by: Actor
    at: datetime
    why: str | None = None
    #: The proposal (an approval request) this change applied.
    request_id: str | None = None
    proposed_by: Actor | None = None
    approved_by: Actor | None = None
    #: What the change loosened, as judged by the version it replaced.
    loosens: list[str] = Field(default_factory=list)


class PolicyPointer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    version: int = Field(ge=1)
    digest: str
    change: PolicyChange


class CorruptPolicy(K3AError):
    """A policy record that does not parse or does not match its digest: the store was
    edited behind k3a's back."""

    exit_code = 4
    hint = "inspect the key named; policy records are written only by `k3a policy`"


@dataclass(frozen=True)
class InForce:
    """The policy that judges: its version (0: the packaged defaults, not yet seeded into
    this store), digest and document."""

    version: int
    digest: str
    document: PolicyDocument
    token: str | None = None

    def __post_init__(self) -> None:
        self.document.shown_as(f"policy v{self.version} ({self.digest[:12]})" if self.version
                               else f"the packaged policy ({self.digest[:12]})")

    def label(self) -> str:
        return policy_label(self.version, self.digest)


def _pointer(store: RecordStore) -> tuple[PolicyPointer | None, str | None]:
    found = store.read(POINTER_KEY)
    if found is None:
        return None, None
    try:
        pointer = PolicyPointer.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptPolicy(f"{POINTER_KEY} in {store.url} is malformed: "
                            f"{exc.errors()[0]['msg']}") from None
    return pointer, found.token


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
    key = document_key(digest)
    found = store.read(key)
    if found is None:
        raise NotFound(f"no policy document {digest} in {store.url}")
    try:
        document = PolicyDocument.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptPolicy(f"{key} is malformed: {exc.errors()[0]['msg']}") from None
    if document.digest != digest:
        raise CorruptPolicy(f"{key} holds a document with digest {document.digest}")
    return document


def packaged_document() -> PolicyDocument:
    return PolicyDocument.from_dir(POLICIES)


def in_force(store: RecordStore) -> InForce:
    """The store's policy in force; the packaged defaults (version 0) while it has none."""
    pointer, token = _pointer(store)
    if pointer is None:
        document = packaged_document()
        return InForce(0, document.digest, document)
    return InForce(pointer.version, pointer.digest, read_document(store, pointer.digest), token)


def store_document(store: RecordStore, document: PolicyDocument) -> None:
    try:
        store.create(document_key(document.digest), canonical_json(document))
    except AlreadyExists:
        read_document(store, document.digest)  # same digest: same content, unless tampered


def commit_change(store: RecordStore, current: InForce, change: PolicyChange) -> InForce:
    pointer = PolicyPointer(version=change.version, digest=change.digest, change=change)
    expected = None if current.version == 0 else current.token
    try:
        store.replace(POINTER_KEY, canonical_json(pointer), expected)
    except Conflict:
        now = in_force(store)
        raise Conflict(
            f"the policy of {store.url} changed to {now.label()} while this change was made; "
            "nothing was written",
            hint="review `k3a policy show` and propose again against it") from None
    try:
        store.create(change_key(change.version), canonical_json(change))
    except AlreadyExists:
        raise CorruptPolicy(f"{change_key(change.version)} already exists") from None
    return in_force(store)


def seeding_document(document: PolicyDocument, acting: Acting) -> PolicyDocument:
    """``document`` as the first policy of a store ``acting`` seeds: naming the root's
    identities with every role where it names none; ConfigError (exit 9) when it names
    identities and none of them holds the seeder's key (the seeder could not act on it)."""
    assert acting.seeding is not None
    if not document.identities.identities:
        return document.with_file(IDENTITIES_FILE, identities_yaml(acting.seeding.identities))
    if document.identities.keyring().get(acting.key_id) is None:
        raise ConfigError(
            f"the policy to seed names identities ({', '.join(document.identities.identities)})"
            f", none with your key {acting.key_id[:16]}: you could not act on it",
            hint="add yourself to its identities.yaml (`k3a key show` prints the entry), or "
            "seed without one: the root's identities are named with every role")
    return document


def _establish_root(store: RecordStore, acting: Acting) -> None:
    """The seeder's root in the store and pinned here: first use makes it; a team's root this
    client pins is published if the store has none yet."""
    seeding = acting.seeding
    assert seeding is not None
    if seeding.first_use:
        enrol.first_use(store, acting.signer, acting.name)
    elif seeding.root.version == 1 and store.read(root_key(1)) is None:
        enrol.publish_first_root(store, seeding.root, acting.signer, acting.name)


def seed(store: RecordStore, document: PolicyDocument, *, acting: Acting,
         why: str | None = None, now: datetime | None = None) -> InForce:
    """Record ``document`` as the store's first policy version; only while it has none.
    First use: ``acting``'s key becomes the store's root (module :mod:`.acting`)."""
    current = in_force(store)
    if current.version != 0 or acting.seeding is None:
        raise Conflict(
            f"{store.url} already has a policy ({current.label()}); a change is proposed and "
            "applied, never seeded over", hint="`k3a policy propose DIR`")
    document = seeding_document(document, acting)
    _establish_root(store, acting)
    store_document(store, document)
    change = PolicyChange(version=1, digest=document.digest, action="seed", by=acting.actor,
                          at=now or datetime.now(UTC), why=why or "first policy of this store")
    return commit_change(store, current, change)


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


def changes(store: RecordStore) -> list[PolicyChange]:
    """Every recorded version of the store's policy, oldest first (the one in force last,
    even if its mover died before writing its change record)."""
    pointer, _ = _pointer(store)
    if pointer is None:
        return []
    out = []
    for version in range(1, pointer.version):
        found = store.read(change_key(version))
        if found is None:
            raise CorruptPolicy(f"{change_key(version)} is missing from {store.url}")
        out.append(PolicyChange.model_validate_json(found.data))
    return [*out, pointer.change]
