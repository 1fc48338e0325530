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
        if not (isinstance(sample, list) and len(sample) == 2 and isinstance(sample[1], str)):
            raise bad(f"a sample {_shown(sample)}, not [time, \"value\"]")
        try:
            value = float(sample[1])
        except ValueError:
            raise bad(f"the value {_shown(sample[1])}, not a number") from None
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise bad(f"the value {sample[1]!r}: infinite, not a measurement")
        return value
