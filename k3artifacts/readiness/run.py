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
from k3artifacts.readiness.code_run import NoSandbox, sandbox
from k3artifacts.readiness.latency import Sampling, sample_latency
from k3artifacts.readiness.loaded import loaded_check, tuple_max_len
from k3artifacts.readiness.redact import Redactor
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
CHECK_NAMES = ("models", "loaded", "chat", "stream", "structured_output", "tool_call",
               "long_context", "sweep")


@dataclass
class Observer:
    """Progress: called as each check and each sweep level completes."""

    on_check: Callable[[CheckResult], None] = lambda _r: None
    on_point: Callable[[SweepPoint], None] = lambda _p: None


def long_context_tokens(release: ReleaseTuple, settings: SmokeSettings,
                        listed: int | None) -> int:
    """The run's long-context size: from the tuple's --max-model-len, else the server's."""
    return checks.context_tokens(settings, tuple_max_len(release) or listed)


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
    allow_unsandboxed_code: bool = False,
    sampling: Sampling | None = None,
) -> ReadinessReport:
    """Smoke (``suite`` None) or eval run of ``endpoint`` for ``release``.
    ``allow_unsandboxed_code``: what the channel's policy says, recorded for the run's own
    verdict (code cases are never run without a sandbox either way). ``sampling``: how many
    per-request latencies an eval run draws (None: none)."""
    obs = observer or Observer()
    started, t0 = datetime.now(UTC), time.monotonic()
    model = release.id
    redactor = Redactor.of_process(endpoint=endpoint, api_key=api_key)
    probe = Probe(make_client(endpoint, settings, api_key=api_key), model, settings,
                  redactor=redactor)
    results: list[CheckResult] = []

    def record(result: CheckResult) -> CheckResult:
        result = result.model_copy(update={
            "detail": redactor(result.detail),
            "skipped": None if result.skipped is None else redactor(result.skipped)})
        obs.on_check(result)
        return result

    first, reachable = checks.models_check(probe)
    results.append(record(first))
    cases: list[CheckResult] = []
    run_sweep: Sweep | None = None
    samples, comparison = None, None
    if not reachable:
        for name in CHECK_NAMES[1:]:
            results.append(record(CheckResult(
                name=name, passed=False,
                detail=f"not run: {redact_url(base_url(endpoint))} is unreachable")))
        for case in suite.cases if suite else []:
            cases.append(record(CheckResult(name=case.name, passed=False, kind=case.check,
                                            detail="not run: the endpoint is unreachable")))
    else:
        results.append(record(loaded_check(probe, release)))
        results.append(record(checks.chat_check(probe)))
        results.append(record(checks.stream_check(probe)))
        results.append(record(checks.judge_case(probe, checks.STRUCTURED)))
        named = {"type": "function", "function": {"name": checks.TOOL.expect}}
        results.append(record(checks.judge_case(probe, checks.TOOL, tool_choice=named)))
        tokens = long_context_tokens(release, settings, checks.listed_max_len(probe))
        probe.long_context_tokens = tokens  # the suite's long-context cases are sized alike
        results.append(record(checks.long_context_check(probe, tokens)))
        for case in suite.cases if suite else []:
            cases.append(record(checks.judge_case(probe, case, kind=case.check)))
        if suite is not None and sampling is not None:
            samples, comparison = sample_latency(
                make_client(endpoint, settings, retries=0, api_key=api_key), model,
                settings.sweep.max_tokens, sampling, baseline)
        sweep_result, run_sweep = _sweep_check(endpoint, probe, settings, obs, api_key)
        results.append(record(sweep_result))
    box = _code_sandbox(cases)
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
        latency=samples,
        baseline=baseline,
        comparison=comparison,
        unreachable=not reachable,
        code_sandbox=box,
        allow_unsandboxed_code=allow_unsandboxed_code,
    )
    if baseline is not None:
        found = regressions(report, baseline, margin=baseline.margin,
                            concurrency=baseline.concurrency)
        report = report.model_copy(update={"regressions": found})
    return report


def _code_sandbox(cases: list[CheckResult]) -> str | None:
    """What isolated the code cases that ran, for the report."""
    if not any(c.kind == "code" and c.skipped is None for c in cases):
        return None
    try:
        return sandbox().description
    except NoSandbox:
        return None


def _sweep_check(endpoint: str, probe: Probe, settings: SmokeSettings, obs: Observer,
                 api_key: str | None) -> tuple[CheckResult, Sweep]:
    client = make_client(endpoint, settings, retries=0, api_key=api_key)
    start = time.monotonic()

    def redacted(point: SweepPoint) -> SweepPoint:
        # What a failed request said is the server's text: bounded and scrubbed like a detail.
        return point.model_copy(update={
            name: probe.redactor(text) for name in ("first_error", "breach")
            if (text := getattr(point, name)) is not None})

    result = sweep(client, probe.model, settings.sweep, settings.slo,
                   lambda p: obs.on_point(redacted(p)))
    result = result.model_copy(update={"points": [redacted(p) for p in result.points]})
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
