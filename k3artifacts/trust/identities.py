"""Who may sign what: identities (people and services), their public keys, and their roles.

The store's policy names them in ``identities.yaml`` (carried by the policy document, so it is
changed only as the policy is: :mod:`k3artifacts.policy.record`)::

    schema_version: 1
    release_channels:          # a channel not listed requires no release signature
      production: {required: true, identities: [release-2026], verify_bytes: true}
    identities:
      alice:
        about: release engineer
        roles: [review, approve, promote, policy]
        keys:
          - pem: |
              -----BEGIN PUBLIC KEY-----
              MCowBQYDK2VwAyEA...
              -----END PUBLIC KEY-----
      eval-ci:
        roles: [evaluate, scan, warm]
        keys:
          - pem: "-----BEGIN PUBLIC KEY-----\\n..."
            kms: arn:aws:kms:us-east-1:111122223333:key/1234abcd-...
      cluster-ops:
        roles: [preflight, traffic]
        keys:
          - pem: "-----BEGIN PUBLIC KEY-----\\n..."
      release-2026:
        roles: [release]
        keys:
          - pem: "-----BEGIN PUBLIC KEY-----\\n..."   # ECDSA P-256 or P-384
            pkcs11: pkcs11:token=release;object=k3a

A record is trusted only when signed by a key listed here under an identity holding the role
that kind of record needs (:data:`ROLES`). One key belongs to one identity: a key shared by two
would let one person count as two where a second identity is required.

Releases (a revision's ``.k3a/model.sig``, a tuple's signature, a warm start's) are signed by
identities holding the ``release`` role, with their ECDSA keys (model-signing's verifiers check
those only; an ed25519 key of such an identity signs its records, never a release).
``release_channels`` says, per channel, whether the promotion gate requires a release
signature, whose (``identities``; empty: every identity holding ``release``), and whether the
gate re-reads the weights against the signed manifest (``verify_bytes``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from k3artifacts.errors import ConfigError, plain_validation_errors
from k3artifacts.signing.keys import Pkcs11Signer
from k3artifacts.trust.keys import (
    KmsSigner,
    PublicKey,
    RecordSigner,
    key_id,
    parse_public_pem,
    public_pem,
)

#: What an identity may sign. ``review``: license and code reviews; ``approve``: answers to
#: approval requests; ``evaluate``, ``scan``, ``preflight``, ``traffic``: evidence records the
#: gates read (evaluation reports, image scans, infrastructure preflights, canary analyses);
#: ``promote``: channel moves (history entries and pointers) and the approval requests they
#: make; ``policy``: policy proposals; ``warm``: warm-start manifests; ``freshness``: the
#: store's signed freshness head (``policy/freshness.py``: a scheduled refresh's identity);
#: ``release``: releases (revisions, tuples, warm starts) in the model-signing format.
Role = Literal["review", "approve", "evaluate", "scan", "preflight", "traffic", "promote",
               "policy", "warm", "freshness", "release"]
ROLES: tuple[Role, ...] = get_args(Role)
#: The roles a store's first policy gives its seeders: every one but ``release``, which a
#: policy change grants to a release key (production stays closed until one does).
SEEDED_ROLES: tuple[Role, ...] = tuple(r for r in ROLES if r != "release")
RELEASE_CURVES = ("secp256r1", "secp384r1")

IDENTITY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:/+=-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KeyEntry(_Strict):
    """One public key of an identity."""

    #: The public key, PEM SubjectPublicKeyInfo: ed25519, ECDSA P-256 or P-384.
    pem: str
    #: For a KMS key: its ARN, so people know which key in which account signs as this
    #: identity. Signatures are checked against ``pem`` alone.
    kms: str | None = None
    #: For a key in an HSM: its ``pkcs11:`` URI (token and object, never a PIN), for people.
    pkcs11: str | None = None

    @field_validator("pem")
    @classmethod
    def _supported(cls, value: str) -> str:
        try:
            parse_public_pem(value)
        except ValueError as exc:
            raise ValueError(f"not a usable PEM public key: {exc}") from None
        return value

    @field_validator("pkcs11")
    @classmethod
    def _no_pin(cls, value: str | None) -> str | None:
        if value is not None and "pin-value" in value:
            raise ValueError("a pkcs11 URI in the policy must not carry a PIN")
        return value

    @cached_property
    def public_key(self) -> PublicKey:
        return parse_public_pem(self.pem)

    @cached_property
    def id(self) -> str:
        return key_id(self.public_key)

    @classmethod
    def of(cls, key: PublicKey) -> KeyEntry:
        return cls(pem=public_pem(key))

    @classmethod
    def for_signer(cls, signer: RecordSigner) -> KeyEntry:
        """The entry naming ``signer``'s public key, and where a KMS or HSM key lives."""
        return cls(pem=public_pem(signer.public_key),
                   kms=signer.arn if isinstance(signer, KmsSigner) else None,
                   pkcs11=signer.source if isinstance(signer, Pkcs11Signer) else None)


def check_unique_keys(owners: Iterable[tuple[str, KeyEntry]]) -> None:
    """ValueError when one key is listed under two identities."""
    seen: dict[str, str] = {}
    for name, entry in owners:
        other = seen.setdefault(entry.id, name)
        if other != name:
            raise ValueError(f"key {entry.id[:16]} is listed under both {other!r} and {name!r}: "
                             "one key is one identity")


def check_names(names: Iterable[str]) -> None:
    for name in names:
        if not IDENTITY_NAME.match(name):
            raise ValueError(f"{name!r} is not an identity name (1-128 of letters, digits and "
                             "._@:/+=-, starting with a letter or digit)")


class Identity(_Strict):
    #: Who this is, for people (a person, a CI job, a team's service account).
    about: str | None = None
    roles: list[Role] = Field(default_factory=list)
    keys: list[KeyEntry] = Field(min_length=1)


class ReleaseChannel(_Strict):
    """Whether a channel requires release signatures, and whose count there."""

    required: bool = True
    #: The identities whose release signatures count on the channel; empty: every identity
    #: holding the ``release`` role.
    identities: list[str] = Field(default_factory=list)
    #: The promotion gate re-reads the weights (xxh3-128) against the signed manifest.
    verify_bytes: bool = True


class Identities(_Strict):
    schema_version: Literal[1] = 1
    #: Before ``identities``, which ends the file: an entry printed by `k3a key show --entry`
    #: is appended to it.
    release_channels: dict[str, ReleaseChannel] = Field(default_factory=dict)
    identities: dict[str, Identity] = Field(default_factory=dict)

    @field_validator("identities", "release_channels", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        # ``identities:`` with nothing under it yet (the packaged file, entries to append).
        return {} if value is None else value

    @field_validator("identities")
    @classmethod
    def _valid(cls, value: dict[str, Identity]) -> dict[str, Identity]:
        check_names(value)
        check_unique_keys((name, k) for name, ident in value.items() for k in ident.keys)
        return value

    @model_validator(mode="after")
    def _release_identities(self) -> Identities:
        for channel, rule in self.release_channels.items():
            wrong = [name for name in rule.identities if name not in self.identities
                     or "release" not in self.identities[name].roles]
            if wrong:
                raise ValueError(f"release_channels.{channel} names {wrong}, not identities "
                                 "holding the release role")
        return self

    def release_keys(self, channel: str | None) -> dict[str, ec.EllipticCurvePublicKey]:
        """The ECDSA keys whose release signatures count on ``channel`` (None: anywhere), by
        name: the identity's, or ``identity:keyid`` where it has several."""
        rule = None if channel is None else self.release_channels.get(channel)
        named = set(rule.identities) if rule is not None and rule.identities else None
        found = {}
        for name, ident in self.identities.items():
            if "release" not in ident.roles or (named is not None and name not in named):
                continue
            usable = [k for k in ident.keys if isinstance(k.public_key, ec.EllipticCurvePublicKey)
                      and k.public_key.curve.name in RELEASE_CURVES]
            for k in usable:
                label = name if len(usable) == 1 else f"{name}:{k.id[:12]}"
                found[label] = k.public_key
        return found

    def keyring(self) -> Keyring:
        return Keyring.of((name, ident.keys, frozenset(ident.roles))
                          for name, ident in self.identities.items())


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    identity: str
    public_key: PublicKey
    roles: frozenset[str]


@dataclass(frozen=True)
class Keyring:
    """Every key an authority (the policy's identities, a root) trusts, by key id."""

    keys: Mapping[str, TrustedKey]

    @classmethod
    def of(cls, owners: Iterable[tuple[str, Collection[KeyEntry], frozenset[str]]]) -> Keyring:
        return cls({k.id: TrustedKey(k.id, name, k.public_key, roles)
                    for name, keys, roles in owners for k in keys})

    def get(self, key_id: str) -> TrustedKey | None:
        return self.keys.get(key_id)

    def __iter__(self) -> Iterator[TrustedKey]:
        return iter(self.keys.values())


def seeded(name: str, key: KeyEntry, *, about: str | None = None) -> Identities:
    """The identities of a store's first policy made on first use: its seeder, with every
    role but ``release`` (a team narrows them, and adds people, by policy changes)."""
    return Identities(identities={name: Identity(about=about, roles=list(SEEDED_ROLES),
                                                 keys=[key])})


def loosening(old: Identities, new: Identities) -> list[str]:
    """What ``new`` trusts that ``old`` did not, in words: a new identity, a new key, a new
    role. Removing any of them only narrows who may sign, so it is never listed."""
    found = []
    for name, ident in new.identities.items():
        before = old.identities.get(name)
        if before is None:
            found.append(f"trusts a new identity {name} ({', '.join(ident.roles) or 'no roles'})")
            continue
        old_ids = {k.id for k in before.keys}
        found += [f"trusts a new key {k.id[:16]} for {name}" for k in ident.keys
                  if k.id not in old_ids]
        added = [r for r in ident.roles if r not in before.roles]
        if added:
            found.append(f"lets {name} sign {', '.join(added)}")
    return found + _release_loosening(old, new)


def _release_loosening(old: Identities, new: Identities) -> list[str]:
    """A channel's release rule dropped, no longer required or re-reading the weights, or
    counting an identity it did not (none listed: every release identity of the policy)."""
    found = []
    for channel, rule in old.release_channels.items():
        later = new.release_channels.get(channel)
        if later is None:
            found.append(f"drops the release rule of {channel}")
            continue
        if rule.required and not later.required:
            found.append(f"no longer requires release signatures on {channel}")
        if rule.verify_bytes and not later.verify_bytes:
            found.append(f"no longer re-reads the weights of {channel}'s releases")
        counted = set(old.release_keys(channel))
        more = sorted(set(new.release_keys(channel)) - counted)
        if more:
            found.append(f"counts release signatures by {', '.join(more)} on {channel}")
    return found


def parse_identities(text: str, *, where: str) -> Identities:
    """``identities.yaml`` text; ConfigError naming ``where`` and the field when malformed."""
    try:
        return Identities.model_validate(yaml.safe_load(text) or {})
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{where} is malformed: {plain_validation_errors(exc)}") from None


class _Dumper(yaml.SafeDumper):
    """PEM keys as literal blocks (``pem: |``), as people write them."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def identities_yaml(identities: Identities) -> str:
    data = identities.model_dump(mode="json", exclude_none=True)
    if not data["release_channels"]:
        del data["release_channels"]
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def entry_yaml(name: str, identity: Identity) -> str:
    """``name``'s entry, indented to go under the ``identities:`` of an ``identities.yaml``
    (``k3a key show --entry``: appended to a copy of the policy, then proposed)."""
    text = yaml.dump({name: identity.model_dump(mode="json", exclude_none=True)},
                     Dumper=_Dumper, sort_keys=False)
    return "".join(f"  {line}" for line in text.splitlines(keepends=True))
