"""Helpers for the flow tests (tests/flows)."""

from __future__ import annotations

from k3artifacts.localhub import LocalHub


def resolve_gets(hub: LocalHub, since: int = 0) -> list[str]:
    """Repo paths of file downloads the hub answered, in order."""
    return [r.target for r in hub.requests[since:] if "/resolve/" in r.url and r.method == "GET"]
