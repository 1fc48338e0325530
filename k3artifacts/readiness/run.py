"""A readiness run: the checks in order, then the suite's cases, then the sweep, as one report.

The run stops early only when nothing answers (``models`` cannot connect): every later check is
recorded as failed with that reason, so even a dead endpoint leaves a complete report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from k3artifacts.net.redact import redact_url
from k3artifacts.readiness import checks
from k3artifacts.readiness.checks import Probe
from k3artifacts.readiness.client import base_url, make_client
from k3artifacts.readiness.suite import SmokeSettings, Suite
from k3artifacts.readiness.sweep import sweep
from k3artifacts.releases.evaluations import (
    Baseline,
    CheckResult,
    ReadinessReport,
    Sweep,
    SweepPoint,
    regressions,
)
from k3artifacts.releases.tuples import ReleaseTuple

SMOKE_SUITE = "smoke"
#: Checks a run always makes, in order (the suite's cases come after, then ``sweep``).
CHECK_NAMES = ("models", "chat", "stream", "structured_output", "tool_call", "long_context",
               "sweep")
#: Room left for the answer when the long-context prompt is sized from the max model length.
ANSWER_ROOM = 512


@dataclass
class Observer:
    """Progress: called as each check and each sweep level completes."""

    on_check: Callable[[CheckResult], None] = lambda _r: None
    on_point: Callable[[SweepPoint], None] = lambda _p: None


def max_model_len(release: ReleaseTuple) -> int | None:
    args = release.binding.serving.args
    for i, arg in enumerate(args):
        if arg.startswith("--max-model-len="):
            return int(arg.split("=", 1)[1])
        if arg == "--max-model-len" and i + 1 < len(args):
            return int(args[i + 1])
    return None


def long_context_tokens(release: ReleaseTuple, settings: SmokeSettings,
                        listed: int | None) -> int:
    """The configured size, else the profile's (or the server's) max length less room for the
    answer, capped: a 128k-token prompt on every promotion costs minutes of GPU prefill."""
    if settings.long_context_tokens:
        return settings.long_context_tokens
    limit = max_model_len(release) or listed or settings.long_context_cap
    return max(1, min(limit - ANSWER_ROOM, settings.long_context_cap))


def _listed_max_len(probe: Probe) -> int | None:
    """vLLM's /v1/models carries ``max_model_len``; other servers may not."""
    try:
        for m in probe.client.models.list():
            if m.id == probe.model:
                value = (m.model_extra or {}).get("max_model_len")
                return int(value) if value else None
    except Exception:  # the models check has already reported any failure to list
        return None
    return None


def run_readiness(
    endpoint: str,
    release: ReleaseTuple,
    settings: SmokeSettings,
    *,
    suite: Suite | None = None,
    suite_sha256: str | None = None,
    baseline: Baseline | None = None,
    observer: Observer | None = None,
    api_key: str | None = None,
) -> ReadinessReport:
    """Smoke (``suite`` None) or eval run of ``endpoint`` for ``release``."""
    obs = observer or Observer()
    started, t0 = datetime.now(UTC), time.monotonic()
    model = release.id
    probe = Probe(make_client(endpoint, settings, api_key=api_key), model, settings)
    results: list[CheckResult] = []

    def record(result: CheckResult) -> CheckResult:
        obs.on_check(result)
        return result

    first, reachable = checks.models_check(probe)
    results.append(record(first))
    cases: list[CheckResult] = []
    run_sweep: Sweep | None = None
    if not reachable:
        for name in CHECK_NAMES[1:]:
            results.append(record(CheckResult(
                name=name, passed=False,
                detail=f"not run: {redact_url(base_url(endpoint))} is unreachable")))
        for case in suite.cases if suite else []:
            cases.append(record(CheckResult(name=case.name, passed=False, kind=case.check,
                                            detail="not run: the endpoint is unreachable")))
    else:
        results.append(record(checks.chat_check(probe)))
        results.append(record(checks.stream_check(probe)))
        results.append(record(checks.judge_case(probe, checks.STRUCTURED)))
        named = {"type": "function", "function": {"name": checks.TOOL.expect}}
        results.append(record(checks.judge_case(probe, checks.TOOL, tool_choice=named)))
        tokens = long_context_tokens(release, settings, _listed_max_len(probe))
        results.append(record(checks.long_context_check(probe, tokens)))
        for case in suite.cases if suite else []:
            cases.append(record(checks.judge_case(probe, case, kind=case.check)))
        sweep_result, run_sweep = _sweep_check(endpoint, probe, settings, obs, api_key)
        results.append(record(sweep_result))
    report = ReadinessReport(
        kind="eval" if suite else "smoke",
        tuple_id=release.id,
        endpoint=redact_url(base_url(endpoint)),
        expected_model=model,
        served_models=probe.seen_models,
        suite=suite.name if suite else SMOKE_SUITE,
        suite_sha256=suite_sha256 if suite and suite_sha256 else settings.digest(),
        started_at=started,
        seconds=round(time.monotonic() - t0, 3),
        checks=results,
        cases=cases,
        min_pass_rate=suite.min_pass_rate if suite else 1.0,
        sweep=run_sweep,
        baseline=baseline,
        unreachable=not reachable,
    )
    if baseline is not None:
        found = regressions(report, baseline, margin=baseline.margin,
                            concurrency=baseline.concurrency)
        report = report.model_copy(update={"regressions": found})
    return report


def _sweep_check(endpoint: str, probe: Probe, settings: SmokeSettings, obs: Observer,
                 api_key: str | None) -> tuple[CheckResult, Sweep]:
    client = make_client(endpoint, settings, retries=0, api_key=api_key)
    start = time.monotonic()
    result = sweep(client, probe.model, settings.sweep, settings.slo, obs.on_point)
    last = result.points[-1]
    if result.knee is None:
        detail = f"concurrency 1 breaks the SLO: {last.breach}"
    else:
        at = result.at(result.knee)
        assert at is not None
        detail = (f"knee at concurrency {result.knee} ({at.tokens_per_s:g} tokens/s, "
                  f"end-to-end p99 {at.e2e_p99} s)")
        detail += f"; stopped at {last.concurrency}: {last.breach}" if last.breach else ""
    check = CheckResult(name="sweep", passed=result.knee is not None, detail=detail,
                        seconds=round(time.monotonic() - start, 4))
    return check, result
