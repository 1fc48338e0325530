"""The shell blocks of the CLI reference's hand-written sections (shell completion, contexts) run
as written, in order, in bash with a fresh HOME and the checkout's `k3a` on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO_ROOT


def _blocks(section: str) -> list[str]:
    text = (REPO_ROOT / "docs" / "reference" / "cli.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", body, re.DOTALL)


def test_completion_and_context_blocks_run_as_written(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": str(Path(sys.executable).parent) + os.pathsep
           + os.environ["PATH"], "LANG": "C.UTF-8"}
    for section in ("Shell completion", "Contexts"):
        (block,) = _blocks(section)
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{section}:\n{done.stdout}\n{done.stderr}"
    config = yaml.safe_load((home / ".config" / "k3a" / "config.yaml").read_text())
    store = f"file://{home}/.local/share/k3artifacts/store"
    assert config == {"current-context": "demo",
                      "contexts": {"demo": {"store": store, "channel": "staging"}}}
    shown = done.stdout.splitlines()
    assert f"store:         {store}  [context demo]" in shown
