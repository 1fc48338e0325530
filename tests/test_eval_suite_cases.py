"""The production suite's cases, asked through the official `openai` client of a server that
answers them right and of servers that do not (no vision, obeys instructions found in tool
results, wraps answers in chatter, answers nothing, refuses, runs out of tokens)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from k3artifacts.readiness.checks import Probe, judge_case
from k3artifacts.readiness.suite import Case, load_suite
from tests.conftest import REPO_ROOT
from tests.support.openai_server import start

SUITE, _ = load_suite(REPO_ROOT / "policies" / "eval-suites" / "k3-core.yaml")
CASES = {c.name: c for c in SUITE.cases}
NEW = ["image-colour", "tool-result-injection", "code-reverse-words", "code-is-prime",
       "refusal-weapons", "long-context"]
MODEL = "Kimi-K3"
REFUSAL = "I can't help with that."
#: Cases whose whole point is a refusal: a refused answer is what they ask for.
ASK_FOR_REFUSAL = {"refusal-wording", "refusal-weapons"}


def _probe(url: str) -> Probe:
    return Probe(client=openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30),
                 model=MODEL, settings=SUITE.smoke)


def _judge(tmp_path: Path, names: list[str], **faults) -> dict[str, tuple[bool, str]]:
    server = start(MODEL, tmp_path / f"openai-{'-'.join(faults) or 'right'}.log", **faults)
    try:
        probe = _probe(server.url)
        return {name: (r.passed, r.detail) for name in names
                for r in [judge_case(probe, CASES[name], kind=CASES[name].check)]}
    finally:
        server.stop()


def test_the_new_cases_pass_when_answered_right(tmp_path):
    results = _judge(tmp_path, NEW)
    assert all(ok for ok, _ in results.values()), results
    assert results["code-is-prime"][1] == "is_prime right on 4 input(s)"


@pytest.mark.parametrize(("faults", "failing", "why"), [
    ({"text_only": True}, {"image-colour"}, "image input is not supported"),
    ({"follow_injections": True}, {"tool-result-injection"}, "which matches '(?i)pwned'"),
    ({"chatty": True}, {"code-reverse-words", "code-is-prime", "long-context"},
     "SyntaxError"),
])
def test_each_wrong_answer_fails_its_case(tmp_path, faults, failing, why):
    results = _judge(tmp_path, NEW, **faults)
    assert {n for n, (ok, _) in results.items() if not ok} == failing, results
    assert any(why in detail for n, (_, detail) in results.items() if n in failing), results


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    """Servers answering every request with one text, by that text (stopped by PID)."""
    started = {}

    def get(text: str) -> Probe:
        if text not in started:
            log = tmp_path_factory.mktemp("answer") / "openai.log"
            started[text] = start(MODEL, log, answer=text)
        return _probe(started[text].url)

    yield get
    for server in started.values():
        server.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_no_case_passes_on_an_empty_answer(answering, name):
    result = judge_case(answering(""), CASES[name], kind=CASES[name].check)
    assert not result.passed, result


@pytest.mark.parametrize("name", list(CASES))
def test_a_refusal_passes_only_the_cases_that_ask_for_one(answering, name):
    result = judge_case(answering(REFUSAL), CASES[name], kind=CASES[name].check)
    assert result.passed == (name in ASK_FOR_REFUSAL), result


def test_an_answer_cut_at_max_tokens_does_not_pass_for_one_that_resisted(answering):
    case = CASES["tool-result-injection"]
    whole = "Revenue grew 4% this quarter." + " and" * case.max_tokens + " PWNED"
    result = judge_case(answering(whole), case, kind=case.check)
    assert not result.passed and "cut at max_tokens (32)" in result.detail, result
    done = judge_case(answering("Revenue grew 4% this quarter."), case, kind=case.check)
    assert done.passed, done


@pytest.mark.parametrize("case", [
    {"check": "exact", "expect": ""},
    {"check": "regex", "expect": "(?i)(maybe)?"},
    {"check": "not_regex", "expect": "(?i)pwned"},
    {"check": "not_regex", "expect": "(?i)pwned", "require": ".*"},
])
def test_a_suite_case_that_would_pass_on_nothing_is_refused(case):
    with pytest.raises(ValueError, match="passes on an empty answer"):
        Case(name="c", prompt="p", **case)
    assert Case(name="c", prompt="p", empty_answer_passes=True, **case).passes_empty()


def test_a_long_context_case_fits_a_small_profile(tmp_path):
    """A 4,096-token server: the case sizes its filler in the server's own tokens."""
    server = start(MODEL, tmp_path / "small.log", max_model_len=4096, chars_per_token=2)
    try:
        result = judge_case(_probe(server.url), CASES["long-context"], kind="exact")
    finally:
        server.stop()
    assert result.passed, result
