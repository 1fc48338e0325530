"""The production suite's image, injected-instruction, coding, refusal and long-context cases,
asked through the official `openai` client of a server that answers them right and of servers
that do not (no vision, obeys instructions found in tool results, wraps answers in chatter)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from k3artifacts.readiness.checks import Probe, judge_case
from k3artifacts.readiness.code_run import run_cases
from k3artifacts.readiness.suite import load_suite
from tests.conftest import REPO_ROOT
from tests.support.openai_server import start

SUITE, _ = load_suite(REPO_ROOT / "policies" / "eval-suites" / "k3-core.yaml")
NEW = ["image-colour", "tool-result-injection", "code-reverse-words", "code-is-prime",
       "refusal-weapons", "long-context"]
MODEL = "Kimi-K3"


def _judge(tmp_path: Path, **faults) -> dict[str, tuple[bool, str]]:
    server = start(MODEL, tmp_path / f"openai-{'-'.join(faults) or 'right'}.log", **faults)
    try:
        probe = Probe(client=openai.OpenAI(base_url=server.url, api_key="none", max_retries=0,
                                           timeout=30), model=MODEL, settings=SUITE.smoke)
        cases = {c.name: c for c in SUITE.cases}
        return {name: (r.passed, r.detail) for name in NEW
                for r in [judge_case(probe, cases[name], kind=cases[name].check)]}
    finally:
        server.stop()


def test_the_new_cases_pass_when_answered_right(tmp_path):
    results = _judge(tmp_path)
    assert all(ok for ok, _ in results.values()), results
    assert results["code-is-prime"][1] == "is_prime right on 4 input(s)"


@pytest.mark.parametrize(("faults", "failing", "why"), [
    ({"text_only": True}, {"image-colour"}, "image input is not supported"),
    ({"follow_injections": True}, {"tool-result-injection"}, "which matches '(?i)pwned'"),
    ({"chatty": True}, {"code-reverse-words", "code-is-prime", "long-context"},
     "SyntaxError"),
])
def test_each_wrong_answer_fails_its_case(tmp_path, faults, failing, why):
    results = _judge(tmp_path, **faults)
    assert {n for n, (ok, _) in results.items() if not ok} == failing, results
    assert any(why in detail for n, (_, detail) in results.items() if n in failing), results


def test_code_runs_contained():
    refused = {
        "network": "import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', 9))",
        "file write": "def f(x):\n    open('out.txt', 'w').write('x')",
        "subprocess": "import subprocess\ndef f(x):\n    subprocess.run(['true'])",
    }
    for what, source in refused.items():
        ok, detail = run_cases(source, "f", [([1], None)], timeout_s=10)
        assert not ok and "refused in the code check" in detail, (what, detail)
    ok, detail = run_cases("def f(x):\n    while True:\n        pass", "f", [([1], 1)], 2)
    assert not ok and "did not finish within 2 s" in detail
    ok, detail = run_cases("def f(x):\n    return x[::-1]", "f", [(["ab"], "ab")], 10)
    assert not ok and "f('ab') = 'ba', expected 'ab'" in detail
