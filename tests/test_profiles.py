"""Serving profiles: shipped recipes load, and a bad flag is refused naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.serving.profiles import load_profile, profiles_dir, serving_spec

SHIPPED = sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def test_the_two_recipes_ship():
    assert {"p6-b300-tp8", "b200x8-2node-tp8-pp2"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_point_at_the_mount(name):
    profile = load_profile(name)
    spec = serving_spec(profile)
    assert spec.args[0] == f"--model={profile.model_mount}"
    assert spec.model_path == profile.model_mount
    assert f"--port={spec.port}" in spec.args
    assert "--served-model-name=Kimi-K3" in spec.args
    assert spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.resources["instance_type"].startswith("ml.")


def test_single_node_b300_recipe():
    spec = serving_spec(load_profile("p6-b300-tp8"))
    for arg in (
        "--tensor-parallel-size=8",
        "--load-format=fastsafetensors",
        "--enable-prefix-caching",
        "--tool-call-parser=kimi_k3",
        "--reasoning-parser=kimi_k3",
        "--enable-auto-tool-choice",
        "--moe-backend=auto",
        "--no-enable-flashinfer-autotune",
        "--trust-remote-code",
    ):
        assert arg in spec.args
    assert spec.port == 8000
    assert spec.env["VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"] == "1"
    assert spec.resources["instance_type"] == "ml.p6-b300.48xlarge"
    assert spec.resources["gpus_per_node"] == 8
    assert spec.resources["request_limits"]["max_concurrent_requests"] > 0


def test_two_node_b200_recipe():
    spec = serving_spec(load_profile("b200x8-2node-tp8-pp2"))
    for arg in (
        "--tensor-parallel-size=8",
        "--pipeline-parallel-size=2",
        "--max-model-len=131072",
        "--gpu-memory-utilization=0.92",
    ):
        assert arg in spec.args
    assert spec.resources["nodes"] == 2


def _write(tmp_path: Path, name: str, **changes) -> Path:
    data = yaml.safe_load((profiles_dir() / "p6-b300-tp8.yaml").read_text())
    data["name"] = name
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_typo_in_a_flag_is_refused_naming_the_file(tmp_path):
    path = _write(tmp_path, "typo", args=["--tensor-paralel-size=8"])
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(path) in str(err.value)
    assert "--tensor-paralel-size is not a known vLLM flag" in str(err.value)


def test_a_profile_cannot_name_the_model(tmp_path):
    path = _write(tmp_path, "hub", args=["--model=moonshotai/Kimi-K3"])
    with pytest.raises(ConfigError, match="--model is not allowed"):
        load_profile(str(path))


def test_a_profile_cannot_turn_the_hub_back_on(tmp_path):
    path = _write(tmp_path, "online", env={"HF_HUB_OFFLINE": "0"})
    with pytest.raises(ConfigError, match="offline"):
        load_profile(str(path))


def test_contradicting_flags_are_refused(tmp_path):
    path = _write(tmp_path, "twice", args=["--enable-prefix-caching", "--no-enable-prefix-caching"])
    with pytest.raises(ConfigError, match="given twice"):
        load_profile(str(path))


def test_schema_errors_name_the_field(tmp_path):
    data = yaml.safe_load((profiles_dir() / "p6-b300-tp8.yaml").read_text())
    data["name"] = "badtype"
    data["serving"]["instance_type"] = "p6-b300.48xlarge"
    path = tmp_path / "badtype.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"badtype.yaml: serving.instance_type"):
        load_profile(str(path))


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(NotFound) as err:
        load_profile("no-such-profile")
    assert "p6-b300-tp8" in (err.value.hint or "")
