"""k3artifacts/settings.py is the one reader of the environment, and its reference page is
generated from it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from k3artifacts import faultpoints
from k3artifacts.errors import ConfigError
from k3artifacts.settings import VARIABLES, load, markdown

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "environment.md"
SETTINGS = ROOT / "k3artifacts" / "settings.py"

#: Environment reads outside settings.py, each with the reason it is not a setting.
NOT_SETTINGS: set[tuple[str, str]] = set()


def _sources() -> list[Path]:
    return sorted(p for d in ("k3artifacts", "flows") for p in (ROOT / d).rglob("*.py"))


def test_reference_page_is_generated_from_settings():
    assert PAGE.read_text() == markdown(), (
        "docs/reference/environment.md differs from k3artifacts/settings.py: regenerate it with "
        "`python -m k3artifacts.settings --markdown > docs/reference/environment.md`"
    )


def test_the_page_regenerates_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "k3artifacts.settings", "--markdown"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout == PAGE.read_text()


def test_only_settings_reads_the_environment():
    found = []
    for path in _sources():
        if path == SETTINGS:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                line = path.read_text().splitlines()[node.lineno - 1]
                if not any(rel == f and name in line for f, name in NOT_SETTINGS):
                    found.append(f"{rel}:{node.lineno}: {line.strip()}")
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                if {a.name for a in node.names} & {"environ", "getenv", "environb"}:
                    found.append(f"{rel}:{node.lineno}: imports os.environ")
            # click reading a variable itself would be a second reader with its own default.
            if isinstance(node, ast.keyword) and node.arg == "envvar":
                value = ast.literal_eval(node.value) if isinstance(node.value, ast.Constant) else "?"
                if value == "?" or value in VARIABLES or str(value).startswith("K3A_"):
                    found.append(f"{rel}:{node.lineno}: click envvar={value}")
    assert not found, "read the environment through k3artifacts.settings:\n" + "\n".join(found)


def test_every_variable_named_in_the_code_is_a_setting():
    # The serving image's build args are labels written into an image, not read by k3a.
    build_args = set(re.findall(r"^ARG (K3A_\w+)", (ROOT / "docker/serving/Dockerfile")
                                .read_text(), re.M))
    named = {}
    for path in [*_sources(), ROOT / "flows" / "prefect.yaml"]:
        for name in re.findall(r"\bK3A_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            named.setdefault(name, path.relative_to(ROOT).as_posix())
    unknown = {n: p for n, p in named.items() if n not in VARIABLES and n not in build_args}
    assert not unknown, f"variables without a setting: {unknown}"
    assert len(VARIABLES) == len(set(VARIABLES))


def test_empty_counts_as_unset_and_values_are_typed(monkeypatch):
    monkeypatch.setenv("K3A_STORE", "")
    monkeypatch.setenv("K3A_S3_PART_SIZE", "8MiB")
    monkeypatch.setenv("K3A_PROGRESS_INTERVAL", "2.5")
    settings = load()
    assert settings.store is None
    assert settings.s3_part_size == 8 * 2**20
    assert settings.progress_interval == 2.5
    monkeypatch.setenv("K3A_S3_PART_SIZE", "16MiB")
    assert load().s3_part_size == 16 * 2**20  # read again when the environment changes


@pytest.mark.parametrize("name,value", [
    ("K3A_S3_PART_SIZE", "1MiB"),
    ("K3A_S3_CONCURRENCY", "zero"),
    ("K3A_LOG_FORMAT", "xml"),
    ("K3A_FAULT_PAUSE", "publish"),
])
def test_a_malformed_value_is_refused_naming_its_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        load()


def test_fault_points_are_off_unless_switched_on(monkeypatch, capsys):
    monkeypatch.delenv("K3A_FAULT_PAUSE", raising=False)
    faultpoints.pause("publish", "x")
    monkeypatch.setenv("K3A_FAULT_PAUSE", "publish@*/x:0")
    faultpoints.pause("reused", "a/x")
    faultpoints.pause("publish", "a/y")
    assert capsys.readouterr().err == ""
    faultpoints.pause("publish", "a/x")
    assert capsys.readouterr().err == "k3a: paused at publish a/x\n"


def test_the_cli_refuses_a_bad_variable_with_exit_9(k3a_cmd, k3a_env, tmp_path):
    env = dict(k3a_env, K3A_LOG_FORMAT="xml", K3A_STORE=f"file://{tmp_path}/store")
    done = subprocess.run([*k3a_cmd, "tuples", "list"], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 9, done.stderr
    assert "K3A_LOG_FORMAT" in done.stderr and "Traceback" not in done.stderr
