"""``k3a smoke | eval``: is an endpoint serving a tuple ready, and how well does it answer."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    acting_here,
    emit,
    from_settings,
    get_store,
    json_option,
    load,
    store_option,
    typed_actor_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import TUPLE_ID, TUPLE_OR_CHANNEL
from k3artifacts.errors import GateFailed, Unavailable

if TYPE_CHECKING:
    from k3artifacts.readiness.record import Recorded
    from k3artifacts.readiness.run import Observer
    from k3artifacts.releases.evaluations import CheckResult, SweepPoint


tuple_option = click.option(
    "--tuple", "tuple_name", required=True, metavar="ID|CHANNEL", type=TUPLE_OR_CHANNEL,
    help="The tuple the endpoint serves: a tuple id, or a channel naming one.")


def _api_key() -> str | None:
    key = load().endpoint_api_key
    return key.get_secret_value() if key is not None else None


api_key_option = click.option(
    "--api-key", default=from_settings(_api_key),
    help="Bearer key, when vLLM runs with --api-key.  [env var: K3A_ENDPOINT_API_KEY]")


def _observer() -> Observer:
    """One line per check and sweep level on stderr: coloured on a terminal, timestamped log
    lines otherwise (CI logs, Prefect workers)."""
    from k3artifacts.readiness.run import Observer

    tty = sys.stderr.isatty()

    def say(ok: bool, text: str) -> None:
        if tty:
            click.secho(("  ok   " if ok else "  FAIL ") + text, fg=None if ok else "red",
                        err=True)
        else:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            click.echo(f"{stamp} readiness {'pass' if ok else 'FAIL'} {text}", err=True)

    def check(r: CheckResult) -> None:
        if r.skipped is not None:  # not run is no failure, and no pass either
            if tty:
                click.secho(f"  SKIP {r.name}: NOT RUN: {r.skipped}", fg="yellow", err=True)
            else:
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                click.echo(f"{stamp} readiness NOT RUN {r.name}: {r.skipped}", err=True)
            return
        say(r.passed, f"{r.name} ({r.seconds:.2f} s): {r.detail}")

    def point(p: SweepPoint) -> None:
        say(p.breach is None, f"sweep concurrency {p.concurrency}: TTFT p99 {p.ttft_p99} s, "
            f"e2e p50/p99 {p.e2e_p50}/{p.e2e_p99} s, {p.tokens_per_s:g} tokens/s, "
            f"{p.errors} errors, {p.rate_limited} x 429 of {p.requests}"
            + (f" -- {p.breach}" if p.breach else ""))

    return Observer(on_check=check, on_point=point)


def _finish(outcome: Recorded, as_json: bool, what: str) -> None:
    report = outcome.report

    def human() -> None:
        s = report.sweep
        if s is not None:
            knee = s.knee if s.knee is not None else "none (concurrency 1 breaks the SLO)"
            click.echo(f"knee: {knee}")
        if report.cases:
            not_run = f"; {len(report.skipped)} not run" if report.skipped else ""
            click.echo(f"pass rate: {report.pass_rate:.1%} ({report.passed_count}/"
                       f"{len(report.judged)} that ran{not_run}; suite threshold "
                       f"{report.min_pass_rate:.1%})")
        if report.baseline:
            click.echo(f"against {report.baseline.tuple_id} ({report.baseline.channel}): "
                       + ("; ".join(report.regressions) or "no regression"))
        if report.comparison:
            click.echo(f"latency: {report.comparison.line} (advisory: the evaluation gate "
                       "judges the recorded samples by the policy in force)")
        elif report.latency:
            click.echo(f"latency: {len(report.latency.e2e)} samples recorded, nothing to "
                       "compare them with")
        if outcome.suite_source:
            click.echo(f"suite: {report.suite} ({outcome.suite_source}, sha256 "
                       f"{report.suite_sha256[:12]})")
        if report.skipped:
            click.echo(f"NOT RUN (skipped, no sandbox): "
                       f"{', '.join(c.name for c in report.skipped)}: {report.skipped[0].skipped}")
        elif report.code_sandbox:
            click.echo(f"code ran in: {report.code_sandbox}")
        verb = "recorded" if outcome.written else "already recorded"
        click.echo(f"{verb}: report {outcome.record.report_sha256[:12]} for {report.tuple_id}")
        click.echo("ready" if report.passed else "NOT READY")

    emit(as_json, {"written": outcome.written, "report_sha256": outcome.record.report_sha256,
                   "passed": report.passed, "suite_source": outcome.suite_source,
                   "pass_rate": {"rate": report.pass_rate, "passed": report.passed_count,
                                 "ran": len(report.judged)},
                   "not_run": [c.name for c in report.skipped],
                   "report": report.model_dump(mode="json")}, human)
    if report.unreachable:
        raise Unavailable(
            f"{report.endpoint} is unreachable: {report.checks[0].detail}",
            hint="check the URL and port, and that the pods are Ready; the report was recorded")
    if not report.passed:  # the judgement the evaluation gate re-applies
        unsandboxed = bool(report.skipped) and not report.allow_unsandboxed_code
        names = [c.name for c in report.failed]
        if unsandboxed:
            names.append(f"{len(report.skipped)} code case(s) not run "
                         f"({report.skipped[0].skipped})")
        steps = [outcome.no_sandbox.next_step] if unsandboxed and outcome.no_sandbox else []
        if report.failed or report.regressions or not steps:
            steps.append("fix the endpoint (or the release)")
        raise GateFailed(f"{what} failed for {report.tuple_id}: "
                         f"{', '.join(names) or 'thresholds'}"
                         + (f"; regressions: {'; '.join(report.regressions)}"
                            if report.regressions else ""),
                         hint="; ".join(steps) + " and run it again")


@exits(
    (0, "ready"),
    (5, "a check failed"),
    (7, "unknown tuple or channel"),
    (8, "endpoint unreachable"),
    (9, "your key is no identity of the store's policy, or lacks the role evaluate"),
)
@click.command("smoke")
@click.argument("endpoint")
@tuple_option
@click.option("--long-context-tokens", type=int, default=None,
              help="Prompt size of the long-context check [default: the profile's "
                   "--max-model-len less 512, at most 32768].")
@click.option("--max-concurrency", type=int, default=16, show_default=True,
              help="Highest level of the sweep (1, 2, 4, ... up to this).")
@click.option("--ttft-slo", type=float, default=2.0, show_default=True,
              help="Time-to-first-token p99 (s) the stream check and the sweep hold to.")
@click.option("--e2e-slo", type=float, default=30.0, show_default=True,
              help="End-to-end p99 (s) beyond which the sweep stops.")
@click.option("--max-error-rate", type=float, default=0.01, show_default=True,
              help="Failed + 429 requests (fraction) beyond which the sweep stops.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds per request (between chunks when streaming).")
@click.option("--retries", type=click.IntRange(0, 5), default=2, show_default=True,
              help="Retries per request (429, 5xx, connection); the sweep never retries.")
@api_key_option
@typed_actor_option
@store_option
@json_option
def smoke_cmd(endpoint: str, tuple_name: str, long_context_tokens: int | None,
              max_concurrency: int, ttft_slo: float, e2e_slo: float, max_error_rate: float,
              timeout: float, retries: int, api_key: str | None, by: str | None, store_url: str,
              as_json: bool) -> None:
    """Check that ENDPOINT (an OpenAI-compatible URL, e.g. http://host:8000) serves the tuple.

    \b
    Checks, each named in the report:
      models             /v1/models lists the tuple's served model name
      chat               a short completion parses and is non-empty
      stream             streamed tokens arrive (first within the TTFT SLO) with a finish reason
      structured_output  a response_format json_schema answer is JSON valid under the schema
      tool_call          a forced tool call is well formed (name, JSON arguments per schema)
      long_context       a long prompt (see --long-context-tokens) is accepted and answered
      sweep              concurrency 1, 2, 4, ... until --max-concurrency or the first SLO
                         breach: TTFT and end-to-end p50/p99, tokens/s, error and 429 rates, knee
    The report is written once, beside the tuple in the store, whatever the verdict, signed
    by your key (role evaluate).

    \b
    Example:
      k3a smoke http://kimi-k3.inference:8000 --tuple production
    """
    from k3artifacts.readiness.record import smoke
    from k3artifacts.readiness.suite import Slo, SmokeSettings, SweepSettings

    settings = SmokeSettings(
        request_timeout_s=timeout, max_retries=retries, long_context_tokens=long_context_tokens,
        slo=Slo(ttft_p99_s=ttft_slo, e2e_p99_s=e2e_slo, max_error_rate=max_error_rate),
        sweep=SweepSettings(max_concurrency=max_concurrency),
    )
    store = get_store(store_url)
    outcome = smoke(store, endpoint, tuple_name, settings, by=acting_here(store, by),
                    observer=_observer(), api_key=api_key)
    _finish(outcome, as_json, "smoke")


@click.group("eval")
def eval_group() -> None:
    """Evaluation runs of tuples against endpoints (what the evaluation gate reads)."""


@exits(
    (0, "passed"),
    (4, "an earlier report the policy does not trust"),
    (5, "failed or regressed"),
    (7, "unknown tuple or suite"),
    (8, "endpoint unreachable"),
    (9, "malformed suite, a channel whose policy names none, or your key is no identity of the "
        "policy or lacks the role evaluate"),
)
@eval_group.command("run")
@click.argument("endpoint")
@tuple_option
@click.option("--suite", "suite", default=None, metavar="NAME|FILE",
              help="A suite of the policy in force by name (k3-core: its "
                   "eval-suites/k3-core.yaml), or a suite file  [default: the suite --channel's "
                   "policy names].")
@click.option("--channel", default=from_settings(lambda: load().channel or "production"),
              show_default="$K3A_CHANNEL or the context's channel, else production",
              help="The channel the evaluation is for: its policy names the default suite and "
                   "says whether code cases may go unrun without a sandbox; the run is compared "
                   "with the latest run of the same suite for the tuple on it.")
@api_key_option
@typed_actor_option
@store_option
@json_option
def eval_run(endpoint: str, tuple_name: str, suite: str | None, channel: str,
             api_key: str | None, by: str | None, store_url: str, as_json: bool) -> None:
    """Run the readiness checks and the suite's cases against ENDPOINT serving the tuple.

    The report records the tuple, the endpoint, the model name the server answered with, the
    suite's sha256, every check and case with its timing and the concurrency sweep; it is
    written once, beside the tuple, signed by your key (role evaluate: a CI job signs with its
    own, K3A_IDENTITY_KEY=kms:KEY for instance). The production gate accepts only such reports,
    of the suite its policy names, signed by an identity its policy lets evaluate. A suite name
    is looked up in the store's policy in force (`k3a policy show`; the packaged defaults
    while the store has none), whatever the working directory. A model's code (code cases)
    runs only in a bubblewrap sandbox; where none can be had those cases are not run, and the
    run fails unless the channel's policy says `allow_unsandboxed_code: true`. The run also
    records per-request latencies (the policy's `latency_regression.min_samples`, one request
    at a time) and judges them against the latest run of the tuple on --channel; that verdict
    is advisory: the gate judges the recorded samples again by the policy in force.

    \b
    Examples:
      k3a eval run http://canary.inference:8000 --tuple k3t-0123456789abcdef01234567
      k3a eval run http://canary.inference:8000 --tuple k3t-0123456789abcdef01234567 \\
          --suite k3-core
    """
    from k3artifacts.readiness.record import evaluate

    store = get_store(store_url)
    outcome = evaluate(store, endpoint, tuple_name, suite, channel=channel,
                       by=acting_here(store, by), observer=_observer(), api_key=api_key)
    _finish(outcome, as_json, "evaluation")


@exits(
    0,
    (7, "unknown tuple"),
    (9, "invalid report, or your key is no identity of the store's policy or lacks the role "
        "evaluate"),
)
@eval_group.command("attach")
@click.argument("tuple_id", type=TUPLE_ID)
@click.argument("report", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@typed_actor_option
@store_option
@json_option
def eval_attach(tuple_id: str, report: Path, by: str | None, store_url: str,
                as_json: bool) -> None:
    """Record REPORT (JSON with "suite", "passed", "total") for TUPLE_ID as an override's evidence.

    Nothing ran it, so the evaluation gate refuses it: promoting on it needs
    `k3a promote T CH --override-gate evaluation --reason "..."`, which the history records.
    The record is signed by your key (role evaluate). Attaching the same report again writes
    nothing.
    """
    from k3artifacts.readiness.record import attach

    store = get_store(store_url)
    record, written = attach(store, tuple_id, report.read_bytes(), str(report),
                             by=acting_here(store, by))
    parsed = record.parsed()

    def human() -> None:
        verb = "attached" if written else "already attached (nothing written)"
        click.echo(
            f"{verb}: {parsed.suite} {parsed.passed}/{parsed.total} = {parsed.pass_rate:.1%} "
            f"to {tuple_id} (report sha256 {record.report_sha256[:12]}); an override's "
            "evidence: the evaluation gate does not accept it"
        )

    emit(as_json, {"written": written, "record": record.model_dump(mode="json")}, human)


@exits(
    0,
    (4, "a report the store's policy does not trust (written by hand, or by an identity that may "
        "not evaluate)"),
)
@eval_group.command("list")
@click.argument("tuple_id", type=TUPLE_ID)
@store_option
@json_option
def eval_list(tuple_id: str, store_url: str, as_json: bool) -> None:
    """Evaluation reports of TUPLE_ID (runs and attached overrides), oldest first, each read
    through its signature ("by": the identity that signed it).
    """
    from k3artifacts.releases.evaluations import list_evaluations

    records = list_evaluations(get_store(store_url), tuple_id)

    def human() -> None:
        header = ["recorded (UTC)", "origin", "suite", "passed", "rate", "by", "report"]
        rows = []
        for r in records:
            p = r.parsed()
            rows.append([r.attached_at.strftime("%Y-%m-%d %H:%M:%S"), r.origin, p.suite,
                         f"{p.passed}/{p.total}", f"{p.pass_rate:.1%}", r.attached_by,
                         r.report_sha256[:12]])
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

    emit(as_json, [r.model_dump(mode="json") for r in records], human)
