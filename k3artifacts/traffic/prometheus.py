"""Instant queries against Prometheus's HTTP API (``/api/v1/query``), as Argo Rollouts' provider
asks them: one evaluation time, a vector of at most one sample per query here.

Through the network layer (a deadline over the whole answer, retries by the settings'
policy). The answer is parsed as hostile: anything but a ``success`` document holding one
``[time, "<number>"]`` sample is refused naming the query (:class:`BadAnswer`, exit 8), and so
is an infinite value; NaN is "no data", which no bound passes.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from urllib.parse import urlencode

from k3artifacts.errors import BadAnswer, ConfigError
from k3artifacts.net.calls import Peer, call
from k3artifacts.net.redact import redact_url

#: A one-sample instant query answers in a few hundred bytes.
MAX_ANSWER = 4 << 20
HINT = ("check --prometheus (a port-forward: kubectl -n monitoring port-forward "
        "svc/prometheus-server 9090:9090)")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Prometheus:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        #: The URL as messages and records show it (a password in it is not).
        self.shown = redact_url(self.url)
        self.peer = Peer(f"Prometheus at {self.shown}", HINT)

    def get(self, path: str, **fields: str) -> object:
        """``data`` of a successful API answer; Prometheus's own error otherwise."""
        answer = call("GET", f"{self.url}{path}?{urlencode(fields)}", self.peer,
                      headers={"Accept": "application/json"}, limit=MAX_ANSWER)
        try:
            body = json.loads(answer.body)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            raise BadAnswer(
                f"{self.shown}{path} answered HTTP {answer.status} with no Prometheus API body",
                hint="--prometheus is the server's base URL (http://host:9090)")
        if body.get("status") == "error":
            raise ConfigError(f"Prometheus refused {fields.get('query', path)!r}: "
                              f"{_shown(body.get('errorType'))}: {_shown(body.get('error'))}")
        if body.get("status") != "success" or answer.status != 200:
            raise BadAnswer(f"{self.shown}{path} answered HTTP {answer.status}, status "
                            f"{_shown(body.get('status'))}: not a Prometheus API answer")
        return body.get("data")

    def _number(self, promql: str, sample: object) -> float:
        if not (isinstance(sample, list) and len(sample) == 2 and isinstance(sample[1], str)):
            raise BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with a sample "
                            f"{_shown(sample)}, not [time, \"value\"]")
        try:
            return float(sample[1])
        except ValueError:
            raise BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with the value "
                            f"{_shown(sample[1])}, not a number") from None

    def buckets(self, promql: str, at: datetime) -> dict[float, float]:
        """A ``sum by (le) (...)`` query's cumulative count under each bucket bound at ``at``
        (``+Inf`` included); empty when there is no series. A count that is negative, NaN
        or infinite, a bound that is not one, or counts falling as bounds rise, are refused
        (BadAnswer): they are no histogram."""
        data = self.get("/api/v1/query", query=promql, time=f"{at.timestamp():.3f}")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "vector" \
                or not isinstance(result, list):
            raise BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with "
                            f"{_shown(data)}, not a vector")
        counts: dict[float, float] = {}
        for series in result:
            labels = series.get("metric") if isinstance(series, dict) else None
            le = labels.get("le") if isinstance(labels, dict) else None
            try:
                bound = float(le)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with a "
                                f"series {_shown(series)} without a bucket bound") from None
            counts[bound] = self._number(promql, series.get("value"))
        ordered = [counts[b] for b in sorted(counts)]
        if any(not math.isfinite(c) or c < 0 for c in ordered) or any(
                b < a - 1e-6 * max(1.0, a) for a, b in zip(ordered, ordered[1:], strict=False)):
            raise BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with bucket "
                            f"counts {_shown(ordered)}: not a histogram")
        return counts

    def value(self, promql: str, at: datetime) -> float | None:
        """The query's one value at ``at``; None when there is none or it is NaN."""
        data = self.get("/api/v1/query", query=promql, time=f"{at.timestamp():.3f}")

        def bad(what: str) -> BadAnswer:
            return BadAnswer(f"Prometheus at {self.shown} answered {promql!r} with {what}")

        if not isinstance(data, dict):
            raise bad(f"data {_shown(data)}, not an object")
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            sample = result
        elif kind == "vector":
            if not isinstance(result, list):
                raise bad(f"a vector result {_shown(result)}, not a list")
            if not result:
                return None
            if len(result) > 1:
                raise ConfigError(f"{promql!r} returned {len(result)} series, expected one")
            if not isinstance(result[0], dict):
                raise bad(f"a series {_shown(result[0])}, not an object")
            sample = result[0].get("value")
        else:
            raise ConfigError(f"{promql!r} returned a {_shown(kind)}, expected a vector")
        value = self._number(promql, sample)
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise bad(f"the value {sample[1]!r}: infinite, not a measurement")  # type: ignore[index]
        return value
