"""Keys that sign records, and the public halves that check them.

Who signed a record is whoever holds the private half of the key that verifies it: a record
says nothing about its author that its signature does not prove. The key this process signs
with is named by a key reference (``K3A_IDENTITY_KEY``, or ``--signing-key`` where a command
signs a release), one of:

* a PEM private key file, ed25519 or ECDSA P-256 / P-384, one per person, in the spirit of
  git's allowed signers (the policy lists each person's public key). Unset, it is this
  account's **personal key** ``$XDG_CONFIG_HOME/k3artifacts/keys/personal.pem``, made on first
  use (ed25519) as ``ssh-keygen`` would make ``~/.ssh/id_ed25519``, in a 0700 directory, 0600;
  a key file others can read is refused, as ssh refuses one;
* ``kms:KEY`` (a key id, ARN or alias): an AWS KMS ``ECC_NIST_P256`` signing key. The IAM
  permission ``kms:Sign`` on it is the identity: the private half never leaves KMS, and no STS
  answer is asked or trusted. The public half comes from ``GetPublicKey``; the message is
  signed ``RAW`` (records' payloads are small by design, :mod:`.envelope`), or, past the
  4096 bytes KMS takes raw (a revision's statement), as the sha256 ``DIGEST`` computed here,
  which is the same ECDSA_SHA_256 signature;
* a ``pkcs11:`` URI: a key held in an HSM, through the PKCS#11 signer of :mod:`k3artifacts.
  signing.keys` (the ``pkcs11`` extra).

:func:`load_signer` is the one loader of a key reference: the same key signs records as an
identity and releases (wrapped by :class:`~k3artifacts.signing.keys.ReleaseSigner`) when its
identity holds the ``release`` role. Every signer has ``public_key``, ``source`` and
``sign(message) -> signature``.
A key id is the sha256 of the public key's PEM SubjectPublicKeyInfo: the number a sigstore
bundle names its key by (``signing/dsse.key_hint``), so one key has one id everywhere in k3a.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pydantic import SecretStr

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.settings import config_home, load
from k3artifacts.signing.dsse import CURVE_HASHES, key_hint
from k3artifacts.signing.keys import KeyReference, Pkcs11Signer, ReleaseSigner
from k3artifacts.trust.localfiles import private_dir, problem, write_new

PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
KeyKind = Literal["ed25519", "ecdsa-p256", "ecdsa-p384"]
CURVES: dict[str, KeyKind] = {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384"}
_NEW_CURVES = {"ecdsa-p256": ec.SECP256R1, "ecdsa-p384": ec.SECP384R1}

PERSONAL_KEY = "personal.pem"
PERSONAL_PUBLIC = "personal.pub.pem"
#: The most KMS signs in one RAW request.
KMS_RAW_LIMIT = 4096
KMS_KEY_SPEC = "ECC_NIST_P256"
KMS_ALGORITHM = "ECDSA_SHA_256"


def key_kind(key: PublicKey) -> KeyKind:
    """Which of the supported kinds ``key`` is; ValueError for any other key."""
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in CURVES:
        return CURVES[key.curve.name]
    kind = key.curve.name if isinstance(key, ec.EllipticCurvePublicKey) else type(key).__name__
    raise ValueError(f"{kind} is not ed25519, ECDSA P-256 or ECDSA P-384")


def key_id(key: PublicKey) -> str:
    return key_hint(key)  # type: ignore[arg-type]  # any SubjectPublicKeyInfo


def public_pem(key: PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def parse_public_pem(text: str | bytes) -> PublicKey:
    """A supported public key from PEM; ValueError saying why not."""
    data = text.encode() if isinstance(text, str) else text
    key = serialization.load_pem_public_key(data)
    key_kind(key)  # type: ignore[arg-type]
    return key  # type: ignore[return-value]


def read_public_key(path: Path) -> PublicKey:
    """The public key in a PEM file (``k3a trust init --root``, ``trust rotate --add``)."""
    try:
        return parse_public_pem(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"public key {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"public key {path}: not a usable PEM public key ({exc})",
                          hint="pass the .pub.pem that `k3a key show` prints") from None


def verifies(key: PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            key.verify(signature, message, ec.ECDSA(CURVE_HASHES[key.curve.name]()))
    except InvalidSignature:
        return False
    return True


class RecordSigner(Protocol):
    public_key: PublicKey
    #: Where the key is, for messages: a path, a KMS key ARN, a pkcs11 URI without its query.
    source: str

    def sign(self, message: bytes) -> bytes: ...


def signer_key_id(signer: RecordSigner) -> str:
    return key_id(signer.public_key)


@dataclass(frozen=True)
class FileSigner:
    """A private key read from a PEM file."""

    private_key: PrivateKey
    source: str
    public_key: PublicKey = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_key", self.private_key.public_key())

    def sign(self, message: bytes) -> bytes:
        key = self.private_key
        if isinstance(key, ed25519.Ed25519PrivateKey):
            return key.sign(message)
        return key.sign(message, ec.ECDSA(CURVE_HASHES[key.curve.name]()))


class KmsSigner:
    """An AWS KMS asymmetric key: KMS signs, nothing here holds the private half."""

    def __init__(self, key: str):
        from k3artifacts.stores import awsclients

        self._client = awsclients.client("kms", endpoint_url=load().kms_endpoint_url)
        answer = self._call(f"KMS GetPublicKey of {key}", self._client.get_public_key, KeyId=key)
        public = serialization.load_der_public_key(answer["PublicKey"])
        # Judged by the key itself, not by the spec's name (KeySpec, formerly
        # CustomerMasterKeySpec, which some KMS implementations still answer alone).
        spec = answer.get("KeySpec") or answer.get("CustomerMasterKeySpec")
        if (not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1"
                or answer.get("KeyUsage") != "SIGN_VERIFY"
                or KMS_ALGORITHM not in answer.get("SigningAlgorithms", [])):
            raise ConfigError(
                f"KMS key {key} is {spec} for {answer.get('KeyUsage')}, not {KMS_KEY_SPEC} for "
                "SIGN_VERIFY",
                hint="aws kms create-key --key-spec ECC_NIST_P256 --key-usage SIGN_VERIFY")
        #: The key as KMS names it in its answer (on AWS, its ARN; an alias resolves to it).
        self.arn = str(answer["KeyId"])
        self.source = f"kms:{self.arn}"
        self.public_key: PublicKey = public

    def sign(self, message: bytes) -> bytes:
        if len(message) > KMS_RAW_LIMIT:
            # KMS hashes a RAW message itself; past its limit the digest is sent instead, and
            # the signature over it is the one ECDSA_SHA_256 makes over the message.
            message, kind = hashlib.sha256(message).digest(), "DIGEST"
        else:
            kind = "RAW"
        answer = self._call(f"KMS Sign with {self.arn}", self._client.sign, KeyId=self.arn,
                            Message=message, MessageType=kind, SigningAlgorithm=KMS_ALGORITHM)
        return bytes(answer["Signature"])

    @staticmethod
    def _call(what: str, call: Callable[..., dict[str, Any]], **params: Any) -> dict[str, Any]:
        import botocore.exceptions as bex

        from k3artifacts.stores.awsclients import error_code, http_status, translate

        try:
            return call(**params)
        except bex.ClientError as exc:
            # KMS's own codes for a key that is not there, or not usable: named as such, not as
            # an unexpected AWS answer.
            code = error_code(exc)
            if not code or code.isdigit():
                # No KMS error at all (an S3 server's XML, a proxy's page, which botocore
                # names by its HTTP status): no KMS answers there, which no retry or
                # permission changes.
                raise ConfigError(
                    f"{what}: the endpoint answered HTTP {http_status(exc)} with no KMS error: "
                    "no AWS KMS answers there, so a kms: identity key cannot sign",
                    hint="point K3A_KMS_ENDPOINT_URL at KMS (unset: AWS's), or sign with a "
                    "personal key or a pkcs11: one (K3A_IDENTITY_KEY): an S3-compatible store "
                    "(SeaweedFS, MinIO) has no KMS") from None
            if code == "NotFoundException":
                raise NotFound(f"{what}: no such KMS key",
                               hint="check K3A_IDENTITY_KEY (kms:KEY-ID, ARN or alias/NAME) and "
                               "the region") from None
            if code in ("DisabledException", "KMSInvalidStateException",
                        "InvalidKeyUsageException"):
                raise ConfigError(f"{what}: {code}: the key cannot sign now",
                                  hint="enable the key, or name another") from None
            raise translate(exc, what) from exc
        except bex.BotoCoreError as exc:
            raise translate(exc, what) from exc


def personal_key_path() -> Path:
    return config_home() / "keys" / PERSONAL_KEY


def load_file_signer(path: Path, password: SecretStr | None = None) -> FileSigner:
    """The private key in ``path``, refused when others can read or write it; an encrypted
    one opened with ``password``, else ``K3A_IDENTITY_KEY_PASSWORD``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no identity key at {path}",
                       hint="`k3a key create` makes your personal key; or set "
                       "K3A_IDENTITY_KEY to a PEM file, kms:KEY or a pkcs11: URI") from None
    except OSError as exc:
        raise ConfigError(f"identity key {path}: {exc.strerror or exc}") from None
    unsafe = problem(path, secret=True)
    if unsafe:
        raise ConfigError(f"identity key {path} refused: {unsafe}",
                          hint=f"chmod 600 {path} (and 700 its directory), as ssh requires of "
                          "a private key; then check no one else used it")
    secret = password or load().identity_key_password
    try:
        key = serialization.load_pem_private_key(
            data, secret.get_secret_value().encode() if secret is not None else None)
        key_kind(key.public_key())  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"identity key {path}: not a usable PEM private key ({exc})",
            hint="an encrypted key needs K3A_IDENTITY_KEY_PASSWORD; keys are ed25519 or "
            "ECDSA P-256/P-384 (`k3a key create` makes one)") from None
    return FileSigner(key, str(path))  # type: ignore[arg-type]


def create_personal_key(kind: KeyKind = "ed25519") -> FileSigner:
    """Make this account's personal key (and its ``.pub.pem`` beside it); FileExistsError
    when there is one already."""
    key: PrivateKey = (ed25519.Ed25519PrivateKey.generate() if kind == "ed25519"
                       else ec.generate_private_key(_NEW_CURVES[kind]()))
    _write_personal_key(key)
    return FileSigner(key, str(personal_key_path()))


def _write_personal_key(key: PrivateKey) -> None:
    path = personal_key_path()
    private_dir(path.parent)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    write_new(path, pem, mode=0o600)
    public = path.with_name(PERSONAL_PUBLIC)
    public.unlink(missing_ok=True)  # a stale half of a key removed by hand
    write_new(public, public_pem(key.public_key()).encode(), mode=0o644)


@dataclass(frozen=True)
class UnsavedPersonalKey(FileSigner):
    """This account's personal key, made for a process that may sign with it and written to
    its file at its first signature: a command refused before it signs anything (a channel
    the policy lacks, a tuple not in the store) leaves no key behind."""

    def sign(self, message: bytes) -> bytes:
        with _SAVING:
            if not Path(self.source).exists():
                try:
                    _write_personal_key(self.private_key)
                except FileExistsError:
                    raise ConfigError(
                        f"another k3a of this account made your personal key ({self.source}) "
                        "meanwhile: this one planned with a key of its own and signed nothing",
                        hint="re-run the same command: it signs with the key now there") from None
        return super().sign(message)


_SAVING = threading.Lock()


@dataclass(frozen=True)
class IdentityKey:
    signer: RecordSigner
    #: True when this call made the personal key (the caller says where, as ssh-keygen does).
    created: bool = False


def identity_signer(*, create: bool, on_first_signature: bool = False) -> IdentityKey:
    """The key this process signs records with: ``K3A_IDENTITY_KEY``, else the personal key,
    made now when absent and ``create`` is set (written to its file at once, or with
    ``on_first_signature`` when it first signs: :class:`UnsavedPersonalKey`)."""
    spec = load().identity_key
    if spec is not None:
        return IdentityKey(load_signer(spec))
    path = personal_key_path()
    if create and not path.exists():
        if on_first_signature:
            return IdentityKey(UnsavedPersonalKey(ed25519.Ed25519PrivateKey.generate(),
                                                  str(path)), created=True)
        try:
            return IdentityKey(create_personal_key(), created=True)
        except FileExistsError:
            pass  # another k3a of this account made it first: use that one
    return IdentityKey(load_file_signer(path))


def load_signer(reference: str | KeyReference) -> RecordSigner:
    """The key ``reference`` names: ``kms:KEY``, a ``pkcs11:`` URI or a PEM file (see the
    module doc); ConfigError (exit 9) naming what is wrong with it."""
    ref = KeyReference.of(reference)
    spec = ref.spec
    if spec.startswith("kms:"):
        return KmsSigner(spec.removeprefix("kms:"))
    if spec.startswith("pkcs11:"):
        return Pkcs11Signer(spec)
    if spec == "sigstore":
        raise ConfigError(
            "sigstore keyless signing needs a Fulcio/Rekor reachable and an identity policy on "
            "every verifier; k3a verifies key signatures only",
            hint="name a key: a PEM file, kms:KEY or a pkcs11: URI (docs/guides/signing.md, "
            "'Keyless')")
    return load_file_signer(Path(spec).expanduser(), ref.password)


def release_signer(reference: str | KeyReference | None) -> ReleaseSigner:
    """The key a release statement is signed with: ``reference``, else this process's
    identity key (``K3A_IDENTITY_KEY``, else the personal key); refused unless ECDSA."""
    if reference is None:
        return ReleaseSigner(identity_signer(create=False).signer)
    return ReleaseSigner(load_signer(reference))
