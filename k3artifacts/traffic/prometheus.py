"""Instant queries against Prometheus's HTTP API (``/api/v1/query``), as Argo Rollouts' provider
asks them: one evaluation time, a vector of at most one sample per query here."""

from __future__ import annotations

import json
import math
from datetime import datetime

import urllib3

from k3artifacts.errors import ConfigError, Unavailable


class Prometheus:
    def __init__(self, url: str, *, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
            retries=urllib3.Retry(total=3, backoff_factor=0.5, status_forcelist=(502, 503, 504),
                                  allowed_methods=frozenset({"GET"})),
        )

    def get(self, path: str, **fields: str) -> object:
        """``data`` of a successful API answer; Prometheus's own error otherwise."""
        try:
            resp = self._http.request("GET", f"{self.url}{path}", fields=fields)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(
                f"Prometheus at {self.url} cannot be reached: {exc}",
                hint="check --prometheus (a port-forward: kubectl -n monitoring port-forward "
                "svc/prometheus-server 9090:9090)",
            ) from None
        try:
            body = json.loads(resp.data)
        except ValueError:
            raise Unavailable(
                f"{self.url}{path} answered HTTP {resp.status} with no Prometheus API body",
                hint="--prometheus is the server's base URL (http://host:9090)",
            ) from None
        if body.get("status") != "success":
            raise ConfigError(
                f"Prometheus refused {fields.get('query', path)!r}: "
                f"{body.get('errorType')}: {body.get('error')}"
            )
        return body.get("data")

    def value(self, promql: str, at: datetime) -> float | None:
        """The query's one value at ``at``; None when there is none or it is NaN."""
        data = self.get("/api/v1/query", query=promql, time=f"{at.timestamp():.3f}")
        assert isinstance(data, dict)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            raw = result[1]
        elif kind == "vector":
            if not result:
                return None
            if len(result) > 1:
                raise ConfigError(f"{promql!r} returned {len(result)} series, expected one")
            raw = result[0]["value"][1]
        else:
            raise ConfigError(f"{promql!r} returned a {kind}, expected a vector")
        value = float(raw)
        return None if math.isnan(value) else value
