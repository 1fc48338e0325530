"""A virtual environment holding only the wheel built from this checkout, made offline.

What ``pip install .`` into a fresh venv makes, without the network: the wheel is built from
the checkout's files (``--no-build-isolation``, the test environment's setuptools) and installed
with ``--no-deps``; the dependencies come from the test environment through a ``.pth`` line, so
nothing is downloaded and the checkout itself is not importable there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

#: What a wheel is built from (the worker Dockerfile copies the same).
SOURCES = ("pyproject.toml", "README.md", "k3artifacts", "manifests", "policies")


def wheel_venv(checkout: Path, base: Path, *, python: str = sys.executable,
               at: Path | None = None) -> Path:
    """A venv at ``at`` (default ``base/venv``; ``base`` holds the build) made by ``python``
    (whose major.minor must be this one's: the dependencies are this environment's), holding
    the wheel of ``checkout``. A venv cannot move: its scripts name its interpreter's path."""
    src = base / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        path = checkout / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q",
                    "-w", str(base / "dist"), str(src)], check=True, capture_output=True)
    wheel = next((base / "dist").glob("k3artifacts-*.whl"))
    env_dir = at or base / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   capture_output=True)
    purelib = Path(sysconfig.get_paths(vars={"base": str(env_dir),
                                             "platbase": str(env_dir)})["purelib"])
    # The test environment's packages, after the venv's own (the wheel's k3artifacts first).
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_k3a_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    subprocess.run([*pip, "--python", str(env_dir / "bin" / "python"), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True, capture_output=True)
    shutil.rmtree(src)
    return env_dir
