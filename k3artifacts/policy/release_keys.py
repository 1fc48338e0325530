"""The release keys a policy document trusts: the ECDSA keys of its identities holding the
``release`` role (``identities.yaml``), and its ``release_channels`` rules, as every reader of
release signatures asks for them (``k3a verify --signature``, the signature gate, warm starts,
a pod's verifier).
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import ConfigError
from k3artifacts.trust.identities import Identities, identities_yaml

#: The ConfigMap file a pod's verifier is rendered with (:meth:`ReleaseKeys.config_map_files`).
RELEASE_IDENTITIES_FILE = "release-identities.yaml"


class ReleaseKeys:
    def __init__(self, identities: Identities, shown: str):
        self.identities = identities
        #: The policy's identities file, as messages name it ("policy v2 (1f3a...)
        #: identities.yaml").
        self.shown = shown

    def required(self, channel: str) -> bool:
        rule = self.identities.release_channels.get(channel)
        return rule is not None and rule.required

    def verify_bytes(self, channel: str) -> bool:
        rule = self.identities.release_channels.get(channel)
        return rule is None or rule.verify_bytes

    def for_channel(self, channel: str | None) -> dict[str, ec.EllipticCurvePublicKey]:
        """The keys whose release signatures count on ``channel`` (None: every release
        identity's), by identity; refuses an empty set."""
        trusted = self.identities.release_keys(channel)
        if not trusted:
            raise ConfigError(
                f"{self.shown} names no identity holding the release role"
                + (f" for channel {channel}" if channel else "")
                + " with an ECDSA key",
                hint="trust the release key by a policy change: its identity, with the role "
                "release, in identities.yaml (docs/guides/signing.md)")
        return trusted

    def config_map_files(self) -> dict[str, str]:
        """The release identities and channel rules, as a ConfigMap's one file: what a pod's
        verifier was rendered to trust, for the record."""
        released = Identities(
            identities={name: ident for name, ident in self.identities.identities.items()
                        if "release" in ident.roles},
            release_channels=self.identities.release_channels)
        return {RELEASE_IDENTITIES_FILE: identities_yaml(released)}
