"""What signs a release statement: any key that signs bytes, wrapped so that what it makes is
a model-signing bundle.

There is one kind of signer in k3a (:func:`k3artifacts.trust.keys.load_signer` loads it from a
key reference: a PEM file, ``kms:KEY`` or a ``pkcs11:`` URI); the same key signs records as
an identity and, when that identity holds the ``release`` role, revisions, tuples and warm
starts. What this module adds is the statement's form: a sigstore bundle of a DSSE envelope
(:func:`k3artifacts.signing.dsse.sign_statement`), which the upstream ``model_signing verify
key`` checks. Upstream verifies ECDSA keys only, so a release statement is signed by an ECDSA
P-256 or P-384 key; an ed25519 key is refused here by name.

The PKCS#11 token signer lives here too (the ``pkcs11`` extra): it signs a digest inside the
token through model-signing's session, for records and statements alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pydantic import SecretStr

from k3artifacts.errors import ConfigError
from k3artifacts.signing.dsse import CURVE_HASHES, KeySigner, key_hint, sign_statement

#: P-521 verifies (sigstore allows it) but is not offered for signing: HSMs rarely hold it.
SIGNING_CURVES = ("secp256r1", "secp384r1")


@dataclass(frozen=True)
class KeyReference:
    """Where a key is (a PEM path, ``kms:KEY``, a ``pkcs11:`` URI), and the passphrase of a
    PEM file when it is not ``K3A_IDENTITY_KEY_PASSWORD``'s (only the migration of the old
    signing variables gives one: :mod:`k3artifacts.migration.signing_variables`)."""

    spec: str
    password: SecretStr | None = None

    @classmethod
    def of(cls, value: str | KeyReference) -> KeyReference:
        return value if isinstance(value, KeyReference) else cls(value)


class ReleaseSigner:
    """A key signing release statements (revisions, tuples, warm starts) as model-signing
    bundles; refuses a key upstream's verifier could not check."""

    def __init__(self, key: KeySigner):
        public = key.public_key
        if not isinstance(public, ec.EllipticCurvePublicKey) \
                or public.curve.name not in SIGNING_CURVES:
            kind = public.curve.name if isinstance(public, ec.EllipticCurvePublicKey) \
                else type(public).__name__.removeprefix("_").removesuffix("PublicKey").lower()
            raise ConfigError(
                f"key {key.source} is {kind}: a release is signed by an ECDSA P-256 or P-384 "
                "key (model-signing's verifiers check those only)",
                hint="pass --signing-key (or set K3A_IDENTITY_KEY to) an ECDSA key: `openssl "
                "ecparam -name prime256v1 -genkey -noout -out KEY.pem`, `k3a key create "
                "--kind ecdsa-p256`, kms:KEY or a pkcs11: URI")
        self.key = key
        self.public_key: ec.EllipticCurvePublicKey = public
        self.source = key.source

    @property
    def key_hint(self) -> str:
        return key_hint(self.public_key)

    def sign(self, statement: dict[str, Any]) -> bytes:
        return sign_statement(self.key, statement)


class Pkcs11Signer:
    """A key held in a PKCS#11 token (an HSM, SoftHSM), through model-signing's session: the
    digest is computed here and signed by the token; the key never leaves it."""

    def __init__(self, uri: str):
        # The URI may carry a PIN (pin-value): never repeat it in messages.
        self.source = uri.split("?", 1)[0]
        try:
            from model_signing._signing.sign_pkcs11 import Signer
        except ImportError as exc:
            raise ConfigError(
                f"PKCS#11 signing needs model-signing's pkcs11 support ({exc})",
                hint="pip install 'k3artifacts[pkcs11]'",
            ) from None
        try:
            self._signer = Signer(uri)
        except Exception as exc:  # PyKCS11 and the URI parser raise their own types
            raise ConfigError(
                f"PKCS#11 key {self.source}: {type(exc).__name__}: {exc}",
                hint="check the token and object names, module-path and the PIN "
                "(pin-source=file:... or pin-value=...)",
            ) from None
        self.public_key: ec.EllipticCurvePublicKey = self._signer.public_key()
        if self.public_key.curve.name not in SIGNING_CURVES:
            raise ConfigError(f"PKCS#11 key {self.source}: {self.public_key.curve.name} is not "
                              "ECDSA P-256 or P-384")

    def sign(self, message: bytes) -> bytes:
        """A DER ECDSA signature over ``message``, hashed here with the curve's digest."""
        import PyKCS11

        digest = hashes.Hash(CURVE_HASHES[self.public_key.curve.name]())
        digest.update(message)
        key_id, label = self._signer.pkcs11_uri.get_keyid_and_label()
        private = self._signer.find_object(PyKCS11.CKO_PRIVATE_KEY, label=label, id=key_id)
        raw = bytes(self._signer.session.sign(private, digest.finalize(),
                                              mecha=PyKCS11.Mechanism(PyKCS11.CKM_ECDSA, None)))
        # The token answers r || s (PKCS#11's form); X.509 verifiers take DER.
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half]), int.from_bytes(raw[half:]))


def parse_public_key(pem: bytes, where: str) -> ec.EllipticCurvePublicKey:
    """A release public key from its PEM text; ``where`` names it in errors."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise ConfigError(f"release key {where}: not a PEM public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVE_HASHES:
        raise ConfigError(f"release key {where}: not an ECDSA public key on a sigstore curve")
    return key
