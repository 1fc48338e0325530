"""``k3a traffic analyze``: the evidence of one canary step, from Prometheus, for the gate."""

from __future__ import annotations

from datetime import datetime

import click

from k3artifacts.cli.common import (
    acting_here,
    emit,
    get_store,
    json_option,
    store_option,
    typed_actor_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import TUPLE_OR_CHANNEL
from k3artifacts.errors import ConfigError, GateFailed


@click.group("traffic")
def traffic_group() -> None:
    """Canary traffic: analyse a rollout step on vLLM's metrics, as its AnalysisTemplate does.

    \b
    The channel's `traffic:` policy (promotion-gates.yaml) gives the steps, the window and the
    bounds; `k3a render --target eks-rollout --rollout-channel CH` renders the same queries
    into the cluster. The `traffic` gate passes when every step's newest analysis passed.
    """


@exits(
    (0, "step passed (recorded)"),
    (5, "step failed (recorded)"),
    (7, "tuple not found"),
    (8, "Prometheus unreachable"),
    (9, "bad policy, step or query, or your key is no identity of the store's policy or lacks the "
        "role traffic"),
)
@traffic_group.command("analyze")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@click.option("--prometheus", "prometheus_url", required=True, metavar="URL",
              help="Prometheus base URL reachable from here (e.g. a port-forward: "
              "http://127.0.0.1:9090).")
@click.option("--channel", required=True,
              help="The channel being rolled out to: its traffic policy gives steps and bounds.")
@click.option("--step", type=click.IntRange(min=0), required=True,
              help="Index of the step in the channel's traffic policy (0: the first cohort).")
@click.option("--at", "at_text", default=None, metavar="ISO-8601",
              help="End of the window (default: now), e.g. when the step's pause ended.")
@typed_actor_option
@store_option
@json_option
def analyze_cmd(tuple_or_channel: str, prometheus_url: str, channel: str, step: int,
                at_text: str | None, by: str | None, store_url: str,
                as_json: bool) -> None:
    """Run one canary step's queries over its window and record the result beside the tuple.

    Each query (finished requests, end-to-end and time-to-first-token quantiles from vLLM's
    histograms, 5xx share of completions) must give a value within the channel's bound; no
    data is a failure, never a pass. The record is created once and never replaced.

    \b
    The record is signed by your key (role traffic).
    """
    from k3artifacts.traffic.analysis import analyze, describe
    at = None
    if at_text is not None:
        try:
            at = datetime.fromisoformat(at_text)
        except ValueError:
            raise ConfigError(f"--at {at_text!r} is not an ISO-8601 time") from None
    store = get_store(store_url)
    done = analyze(store, tuple_or_channel, channel, step, prometheus_url=prometheus_url,
                   by=acting_here(store, by), at=at)
    analysis, record, written = done.analysis, done.record, done.written
    payload = {"passed": analysis.passed, "written": written,
               "analysis_sha256": record.analysis_sha256,
               "analysis": analysis.model_dump(mode="json")}

    def human() -> None:
        for m in analysis.metrics:
            mark = "ok  " if m.passed else "FAIL"
            click.echo(f"  {mark} {describe(m)}")
        for c in analysis.against_stable:
            mark = "ok  " if c.judgement.passed else "FAIL"
            click.echo(f"  {mark} {c.judgement.line}")
        verb = "recorded" if written else "already recorded"
        click.echo(f"{verb}: analysis {record.analysis_sha256[:12]} of {analysis.tuple_id}, step "
                   f"{step} ({analysis.weight}%) on {channel}, window {analysis.window} ending "
                   f"{analysis.at:%Y-%m-%dT%H:%M:%SZ}")
        click.echo("step passed" if analysis.passed else "STEP FAILED: abort the rollout "
                   "(kubectl argo rollouts abort NAME) and keep the stable tuple")

    emit(as_json, payload, human)
    if not analysis.passed:
        # Raised, not exited: the group prints the document with the error merged in.
        failed = ", ".join([m.name for m in analysis.metrics if not m.passed]
                           + [f"{c.name} against {c.stable_tuple_id}"
                              for c in analysis.against_stable if not c.judgement.passed])
        raise GateFailed(f"step {step} of {analysis.tuple_id} on {channel} failed: {failed}",
                         hint="abort the rollout (kubectl argo rollouts abort NAME) and keep "
                         "the stable tuple")
