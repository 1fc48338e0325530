"""The synthetic release's remote code loads as transformers loads a Hub repo's: its modeling
module imports its configuration module relatively (a repo's files become one dynamic package),
so a model class and its config class meet as they do for the real Kimi K3."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from k3artifacts.localhub.synthetic import write_release

pytest.importorskip("transformers")

# In a child process: transformers fixes its modules cache (and puts it on sys.path) on import.
LOAD = """
import sys
from transformers import AutoConfig
from transformers.dynamic_module_utils import get_class_from_dynamic_module
repo = sys.argv[1]
config = AutoConfig.from_pretrained(repo, trust_remote_code=True)
model_class = get_class_from_dynamic_module("modeling_kimi_k3.KimiK3ForCausalLM", repo)
config_class = model_class.config_class
# The config class the model names comes from the same dynamic package as the model.
same_package = config_class.__module__.rpartition(".")[0] == model_class.__module__.rpartition(".")[0]
print(type(config).__name__, config.model_type, config_class.__name__, same_package)
"""


def test_the_remote_code_loads_with_transformers_dynamic_modules(tmp_path):
    repo = tmp_path / "release"
    write_release(repo, total_bytes=1 << 20, shards=1)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(repo)], env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["KimiK3Config", "kimi_k3", "KimiK3Config", "True"]
