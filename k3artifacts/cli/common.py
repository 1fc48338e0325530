"""What every k3a command shares: the store option, --json output, errors -> exit codes."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from k3artifacts.canonical import to_plain
from k3artifacts.config import default_store_url, parse_size
from k3artifacts.errors import K3AError
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import open_store

store_option = click.option(
    "--store",
    "store_url",
    envvar="K3A_STORE",
    default=default_store_url,
    show_default="$K3A_STORE or ~/.local/share/k3artifacts/store",
    help="Release store: file:///path (local disk or FSx mount) or s3://bucket/prefix.",
)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (for scripts)."
)


def get_store(url: str) -> Store:
    return open_store(url)


def emit(as_json: bool, payload: Any, human: Callable[[], None]) -> None:
    """Print ``payload`` as JSON for scripts, or call ``human`` to print for people."""
    if as_json:
        click.echo(json.dumps(to_plain(payload), indent=2, sort_keys=True, default=str))
    else:
        human()


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one clear message on stderr and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except K3AError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            if exc.hint:
                click.echo(f"next: {exc.hint}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


class ByteSize(click.ParamType):
    """Sizes like 64MiB, 4GiB, 1.5GB or plain bytes."""

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
