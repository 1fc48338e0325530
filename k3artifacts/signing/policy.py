"""Which keys are trusted, and which channels require signatures: ``signing/`` of the store's
policy in force (the packaged defaults: ``policies/signing/``).

``signing/trusted-keys.yaml``::

    schema_version: 1
    keys:                      # name -> PEM public key file, relative to signing/
      release-2026: keys/release-2026.pub.pem
    channels:                  # a channel not listed requires nothing and trusts every key
      production: {required: true, keys: [release-2026], verify_bytes: true}

A channel's ``keys`` are the only ones whose signatures count for it (empty: every key listed
above). Changed like the rest of the policy (``k3a policy propose`` / ``apply``): trusting a
key loosens it, so it needs the root's threshold of signatures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.errors import ConfigError
from k3artifacts.signing.keys import parse_public_key

SIGNING_DIR = "signing"
TRUSTED_KEYS_FILE = "trusted-keys.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChannelSigning(_Strict):
    required: bool = True
    keys: list[str] = Field(default_factory=list)
    #: The promotion gate re-reads the weights (xxh3-128) against the signed manifest.
    verify_bytes: bool = True


class SigningPolicy(_Strict):
    schema_version: Literal[1] = 1
    keys: dict[str, str]
    channels: dict[str, ChannelSigning] = Field(
        default_factory=lambda: {"production": ChannelSigning()}
    )

    @model_validator(mode="after")
    def _known_keys(self) -> SigningPolicy:
        for channel, rule in self.channels.items():
            unknown = sorted(set(rule.keys) - set(self.keys))
            if unknown:
                raise ValueError(f"channel {channel!r} names unknown key(s) {unknown}")
        return self


class TrustedKeys:
    """The policy with its public keys loaded."""

    def __init__(self, policy: SigningPolicy, keys: dict[str, ec.EllipticCurvePublicKey],
                 shown: str):
        self.policy = policy
        self.keys = keys
        #: The policy file, as messages name it.
        self.shown = shown

    def required(self, channel: str) -> bool:
        rule = self.policy.channels.get(channel)
        return rule is not None and rule.required

    def verify_bytes(self, channel: str) -> bool:
        rule = self.policy.channels.get(channel)
        return rule is None or rule.verify_bytes

    def for_channel(self, channel: str | None) -> dict[str, ec.EllipticCurvePublicKey]:
        """The keys trusted on ``channel`` (None: every listed key); refuses an empty set."""
        rule = None if channel is None else self.policy.channels.get(channel)
        if rule is None or not rule.keys:
            trusted = dict(self.keys)
        else:
            trusted = {name: self.keys[name] for name in rule.keys}
        if not trusted:
            raise ConfigError(
                f"{self.shown} lists no trusted signing key"
                + (f" for channel {channel}" if channel else ""),
                hint="add the release public key there (README, 'Signing')",
            )
        return trusted


def trusted_keys_of(files: Mapping[str, str], where: str) -> TrustedKeys:
    """The signing policy and its keys from a policy's files (path relative to the policies
    directory -> text); ``where`` prefixes each path in messages (a directory and ``/``, or
    ``policy v2 (1f3a...) ``)."""
    shown = f"{where}{SIGNING_DIR}/{TRUSTED_KEYS_FILE}"
    text = files.get(f"{SIGNING_DIR}/{TRUSTED_KEYS_FILE}")
    if text is None:
        raise ConfigError(f"{shown} not found: no trusted signing keys",
                          hint="list the release public keys there (README, 'Signing')")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{shown}: not YAML: {exc}") from None
    try:
        policy = SigningPolicy.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{shown}: {exc}") from None
    keys = {}
    for name, rel in policy.keys.items():
        pem = files.get(f"{SIGNING_DIR}/{rel}")
        if pem is None:
            raise ConfigError(f"trusted key {where}{SIGNING_DIR}/{rel}: not found")
        keys[name] = parse_public_key(pem.encode(), f"{where}{SIGNING_DIR}/{rel}")
    return TrustedKeys(policy, keys, shown)


def config_map_files(trusted: TrustedKeys) -> dict[str, str]:
    """``signing/`` of a policy as flat files for a Kubernetes ConfigMap (whose keys cannot
    hold ``/``): the policy with each key file renamed ``<name>.pub.pem``, and those files.
    Mounted at ``<policies>/signing``, it loads exactly like the original."""
    renamed = {name: f"{name}.pub.pem" for name in trusted.policy.keys}
    policy = trusted.policy.model_copy(update={"keys": renamed})
    files = {TRUSTED_KEYS_FILE: yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=True)}
    for name, key in sorted(trusted.keys.items()):
        files[renamed[name]] = key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()
    return files
