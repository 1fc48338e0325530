"""Release keys trusted the old way (``signing/trusted-keys.yaml`` and its key files, in the
store's policy in force) made identities holding the ``release`` role: the one reader of that
file, a family of ``k3a trust migrate`` (:mod:`.registry`).

``signing/trusted-keys.yaml``, as it was::

    schema_version: 1
    keys:                      # name -> PEM public key file, relative to signing/
      release-2026: keys/release-2026.pub.pem
    channels:                  # a channel not listed requires nothing and trusts every key
      production: {required: true, keys: [release-2026], verify_bytes: true}

Each key becomes an identity of that name with the role ``release`` (a key some identity of the
policy holds already gives that identity the role instead: one key is one identity), each
channel rule a ``release_channels`` rule naming those identities, and the ``signing/`` files
leave the policy. The change is proposed and applied as any policy change is (it adds
identities and roles, so it needs the root's threshold of signatures): with a root of one, the
migrating identity applies it; otherwise it stays proposed and the migration ends naming the
request (exit 5), for another root identity's ``k3a approve REQUEST`` and ``k3a policy apply
REQUEST``. Signatures made by those keys verify
as before: a signature names its key, not how the policy trusted it.

Read until k3artifacts 0.3.0 (2027-06-30), as the old signing variables
(:mod:`.signing_variables`).
"""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.errors import ConfigError
from k3artifacts.policy.approvals import InvalidApproval
from k3artifacts.policy.change import apply, propose
from k3artifacts.policy.document import IDENTITIES_FILE, SIGNING_FILE, PolicyDocument
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.policy.record import in_force
from k3artifacts.signing.keys import parse_public_key
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.identities import (
    IDENTITY_NAME,
    Identities,
    Identity,
    KeyEntry,
    ReleaseChannel,
    identities_yaml,
)

SIGNING_DIR = "signing"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChannelSigning(_Strict):
    required: bool = True
    keys: list[str] = Field(default_factory=list)
    verify_bytes: bool = True


class SigningPolicy(_Strict):
    schema_version: Literal[1] = 1
    keys: dict[str, str]
    channels: dict[str, ChannelSigning] = Field(
        default_factory=lambda: {"production": ChannelSigning()})


def _trusted_keys(document: PolicyDocument) -> tuple[SigningPolicy, dict[str, KeyEntry]]:
    shown = f"{document.label} {SIGNING_FILE}"
    try:
        policy = SigningPolicy.model_validate(yaml.safe_load(document.files[SIGNING_FILE]))
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"{shown}: {exc}") from None
    keys = {}
    for name, rel in policy.keys.items():
        where = f"{document.label} {SIGNING_DIR}/{rel}"
        pem = document.files.get(f"{SIGNING_DIR}/{rel}")
        if pem is None:
            raise ConfigError(f"trusted key {where}: not in the policy")
        keys[name] = KeyEntry.of(parse_public_key(pem.encode(), where))
    return policy, keys


def migrated(document: PolicyDocument) -> PolicyDocument:
    """``document`` with its trusted release keys as identities holding ``release``, its
    channel rules as ``release_channels``, and no ``signing/`` file."""
    policy, keys = _trusted_keys(document)
    identities = dict(document.identities.identities)
    owner = {k.id: name for name, ident in identities.items() for k in ident.keys}
    named = {}
    for key_name, entry in keys.items():
        name = owner.get(entry.id)
        if name is None:
            # The key's own name where it is free; else one no person would have chosen.
            free = [n for n in (key_name, f"{key_name}-release", f"release-{entry.id}")
                    if IDENTITY_NAME.match(n) and n not in identities]
            if not free:
                raise ConfigError(
                    f"{document.label} {SIGNING_FILE}: key {key_name!r} cannot be named as an "
                    f"identity (every name tried is taken: {key_name}, {key_name}-release, "
                    f"release-{entry.id})",
                    hint="migrate it by hand: `k3a policy show --out DIR`, add the key to "
                    "DIR/identities.yaml with the release role under a free name, remove "
                    "DIR/signing, then `k3a policy propose DIR` (docs/guides/signing.md)")
            name = free[0]
            identities[name] = Identity(about=f"release key {key_name} (migrated from "
                                        f"{SIGNING_FILE})", roles=["release"], keys=[entry])
        elif "release" not in identities[name].roles:
            identities[name] = identities[name].model_copy(
                update={"roles": [*identities[name].roles, "release"]})
        owner[entry.id] = named[key_name] = name
    channels = {
        channel: ReleaseChannel(required=rule.required, verify_bytes=rule.verify_bytes,
                                identities=sorted({named[k] for k in rule.keys}))
        for channel, rule in policy.channels.items()}
    result = Identities(identities=identities,
                        release_channels={**document.identities.release_channels, **channels})
    files = {rel: text for rel, text in document.files.items()
             if not rel.startswith(f"{SIGNING_DIR}/")}
    files[IDENTITIES_FILE] = identities_yaml(result)
    return PolicyDocument.parse_files(files, where=document.label)


class ReleaseKeysMigrator:
    family = "release keys"

    def plan(self, store: RecordStore) -> FamilyPlan:
        current = in_force(store)
        if current.version == 0 or SIGNING_FILE not in current.document.files:
            return FamilyPlan(self.family, ())
        # Migrated here too, unused: a file no migration can read stops the run before the
        # first family writes anything.
        migrated(current.document)
        policy, _ = _trusted_keys(current.document)
        return FamilyPlan(self.family, (
            f"propose {current.label()}'s release keys ({', '.join(policy.keys) or 'none'}, "
            f"{SIGNING_FILE}) as identities holding the release role and its channel rules as "
            "release_channels, then apply it if your signature is all the root needs (else "
            "the migration ends naming the request, for another root identity's `k3a approve`"
            ")",))

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        if not plan.steps:
            return
        # Read again: a policy older than signing was signed into force by the policy family
        # of this same run, naming identities the release keys join.
        document = migrated(in_force(store).document)
        request, _ = propose(store, document, by=who.acting,
                             why="release keys as identities holding the release role "
                             "(`k3a trust migrate`)")
        try:
            apply(store, request.id, by=who.acting)
        except InvalidApproval as exc:
            # Last of the families: everything else is migrated; this change waits.
            raise InvalidApproval(
                f"the release keys are proposed as identities ({request.id}), not applied: "
                f"{exc}", hint=f"another root identity runs `k3a approve {request.id}`, then "
                f"`k3a policy apply {request.id}`") from None


MIGRATOR = ReleaseKeysMigrator()
