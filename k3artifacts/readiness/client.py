"""The official ``openai`` client, bounded: every request has a timeout and a retry budget, and
every failure becomes one line a person can act on."""

from __future__ import annotations

import openai

from k3artifacts.net.endpoint import endpoint_client
from k3artifacts.readiness.suite import SmokeSettings


def base_url(endpoint: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1`` both mean the server's ``/v1`` API."""
    url = endpoint.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def make_client(endpoint: str, settings: SmokeSettings, *, retries: int | None = None,
                api_key: str | None = None) -> openai.OpenAI:
    # vLLM ignores the key unless started with --api-key; the client refuses to start without.
    # The network layer's httpx client: the answer's headers within the request timeout in
    # all, however the endpoint trickles them.
    return openai.OpenAI(
        base_url=base_url(endpoint),
        api_key=api_key or "unused",
        max_retries=settings.max_retries if retries is None else retries,
        timeout=openai.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s),
        http_client=endpoint_client(connect=settings.connect_timeout_s,
                                    read=settings.request_timeout_s,
                                    headers_deadline=settings.request_timeout_s),
    )


def unreachable(exc: BaseException) -> bool:
    """Nothing answered at all: the endpoint is down, not misbehaving."""
    return isinstance(exc, openai.APIConnectionError)


def describe(exc: BaseException, retries: int) -> str:
    attempts = f"after {retries + 1} attempt(s)"
    if isinstance(exc, openai.APITimeoutError):
        return f"timed out {attempts}"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        while cause is not None and cause.__cause__ is not None:
            cause = cause.__cause__
        text = str(cause or exc)
        if "refused" in text.lower():
            return f"connection refused ({text}) {attempts}"
        return f"cannot connect: {text} {attempts}"
    if isinstance(exc, openai.RateLimitError):
        return f"rate limited: HTTP 429 {attempts}"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        return f"HTTP {exc.status_code}: {body.get('message') or exc.message}"
    if isinstance(exc, openai.APIResponseValidationError):
        return f"malformed response: {exc.message}"
    if "timeout" in type(exc).__name__.lower():
        return f"timed out mid-stream ({type(exc).__name__})"
    return f"malformed response: {type(exc).__name__}: {exc}"
