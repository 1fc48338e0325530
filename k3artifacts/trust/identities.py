"""Who may sign what: identities (people and services), their public keys, and their roles.

The store's policy names them in ``identities.yaml`` (carried by the policy document, so it is
changed only as the policy is: :mod:`k3artifacts.policy.record`)::

    schema_version: 1
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

A record is trusted only when signed by a key listed here under an identity holding the role
that kind of record needs (:data:`ROLES`). One key belongs to one identity: a key shared by two
would let one person count as two where a second identity is required.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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
#: store's signed freshness head (``policy/freshness.py``: a scheduled refresh's identity).
Role = Literal["review", "approve", "evaluate", "scan", "preflight", "traffic", "promote",
               "policy", "warm", "freshness"]
ROLES: tuple[Role, ...] = get_args(Role)

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


class Identities(_Strict):
    schema_version: Literal[1] = 1
    identities: dict[str, Identity] = Field(default_factory=dict)

    @field_validator("identities")
    @classmethod
    def _valid(cls, value: dict[str, Identity]) -> dict[str, Identity]:
        check_names(value)
        check_unique_keys((name, k) for name, ident in value.items() for k in ident.keys)
        return value

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
    role (a team narrows them, and adds people, by policy changes)."""
    return Identities(identities={name: Identity(about=about, roles=list(ROLES), keys=[key])})


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
    return yaml.dump(identities.model_dump(mode="json", exclude_none=True), Dumper=_Dumper,
                     sort_keys=False)


def entry_yaml(name: str, identity: Identity) -> str:
    """``name``'s entry, indented to go under the ``identities:`` of an ``identities.yaml``
    (``k3a key show --entry``: appended to a copy of the policy, then proposed)."""
    text = yaml.dump({name: identity.model_dump(mode="json", exclude_none=True)},
                     Dumper=_Dumper, sort_keys=False)
    return "".join(f"  {line}" for line in text.splitlines(keepends=True))
