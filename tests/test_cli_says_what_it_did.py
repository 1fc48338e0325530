"""Output read as a person reads it: `policy show --out DIR` says where the files went and what
to do with them, not the whole policy again; the evaluation gate's hint names the suite as
`k3a eval run --suite` takes it from any directory (by name), never a checkout path."""

from __future__ import annotations

from tests.support.cli import invoke
from tests.support.ports import free_ports

IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64


def _tuple(env) -> str:
    commit = invoke("demo", "--size", "2MiB", "--shards", "1", "--json", env=env).json["commit"]
    return invoke("tuple", "create", f"demo/Kimi-K3-synthetic@{commit}", "--offline",
                  "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image", VERIFIER,
                  env=env).stdout.split()[0]


def test_policy_show_out_writes_the_files_and_says_so_without_the_text(tmp_path):
    env = {"K3A_STORE": f"file://{tmp_path / 'store'}"}
    _tuple(env)
    out = tmp_path / "policy"
    shown = invoke("policy", "show", "--out", str(out), env=env).stdout
    lines = shown.splitlines()
    assert len(lines) == 4, shown
    assert lines[0].startswith("policy ") and lines[2] == f"written to: {out}"
    assert lines[3] == f"next: edit the files there, then `k3a policy propose {out}`"
    assert (out / "promotion-gates.yaml").read_text() not in shown
    assert len(invoke("policy", "show", env=env).stdout.splitlines()) > 20


def test_the_evaluation_gate_names_the_suite_as_eval_run_takes_it(tmp_path, monkeypatch):
    env = {"K3A_STORE": f"file://{tmp_path / 'store'}"}
    tuple_id = _tuple(env)
    gates = invoke("gates", tuple_id, "production", "--json", env=env, expect=5).json
    (evaluation,) = [g for g in gates["results"] if g["name"] == "evaluation"]
    hint = evaluation["reason"]
    assert f"--tuple {tuple_id} --suite k3-core`" in hint and "policies/" not in hint, hint
    # The suite so named is found from anywhere (here, a directory that is no checkout): the
    # run goes as far as the endpoint, which is not there.
    monkeypatch.chdir(tmp_path)
    port = free_ports(1)[0]
    ran = invoke("eval", "run", f"http://127.0.0.1:{port}", "--tuple", tuple_id, "--suite",
                 "k3-core", env=env, expect=None)
    assert "no suite" not in ran.stderr and ran.exit_code == 8, ran.report()
