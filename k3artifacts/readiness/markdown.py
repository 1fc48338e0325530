"""A readiness report as markdown: a table of checks and latency against concurrency (a bar
per level, so the knee shows in a Prefect artifact or a pull request without an image)."""

from __future__ import annotations

from k3artifacts.releases.evaluations import CheckResult, ReadinessReport

BAR_WIDTH = 30


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(results: list[CheckResult]) -> list[str]:
    return [f"| {r.name} | {'pass' if r.passed else '**FAIL**'} | {r.seconds:.2f} s | "
            f"{_cell(r.detail)} |" for r in results]


def report_markdown(report: ReadinessReport) -> str:
    verdict = "ready" if report.passed else "**NOT READY**"
    lines = [
        f"# {report.kind} of {report.tuple_id}: {verdict}",
        "",
        f"endpoint {report.endpoint}, model {report.expected_model!r} "
        f"(server answered as {', '.join(report.served_models) or 'nothing'}), "
        f"suite {report.suite} sha256 {report.suite_sha256[:12]}, {report.seconds:.1f} s",
        "",
        "| check | result | time | detail |",
        "|---|---|---|---|",
        *_rows(report.checks),
        *_rows(report.cases),
    ]
    if report.cases:
        lines += ["", f"pass rate {report.pass_rate:.1%} "
                      f"(suite threshold {report.min_pass_rate:.1%})"]
    if report.baseline:
        b = report.baseline
        lines += ["", f"compared with {b.tuple_id} on {b.channel} (pass rate {b.pass_rate:.1%}, "
                      f"p99 {b.e2e_p99} s): "
                      + ("; ".join(report.regressions) or "no regression")]
    if report.comparison:
        lines += ["", f"latency: {_cell(report.comparison.line)}"]
    if report.sweep and report.sweep.points:
        worst = max((p.e2e_p99 or 0.0) for p in report.sweep.points) or 1.0
        lines += ["", f"## Latency against concurrency (knee: {report.sweep.knee})", "",
                  "| concurrency | TTFT p50 / p99 (s) | e2e p50 / p99 (s) | tokens/s | "
                  "errors / 429 | e2e p99 | SLO |",
                  "|---:|---|---|---:|---|---|---|"]
        for p in report.sweep.points:
            bar = "█" * max(1, round(BAR_WIDTH * (p.e2e_p99 or 0.0) / worst))
            lines.append(
                f"| {p.concurrency} | {p.ttft_p50} / {p.ttft_p99} | {p.e2e_p50} / {p.e2e_p99} | "
                f"{p.tokens_per_s:g} | {p.errors} / {p.rate_limited} of {p.requests} | "
                f"`{bar}` | {_cell(p.breach) if p.breach else 'ok'} |")
    return "\n".join(lines)
