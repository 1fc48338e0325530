"""What every k3a command shares: the store option, --json output, progress, sizes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli import RESUME_HINT, set_interrupt_hint
from k3artifacts.cli.app import DOCUMENT_META, JSON_META, print_document
from k3artifacts.config import default_policies_dir, default_store_url, parse_size
from k3artifacts.errors import NotFound
from k3artifacts.reporting.logs import LOG_FORMATS
from k3artifacts.reporting.progress import DEFAULT_INTERVAL

if TYPE_CHECKING:
    from k3artifacts.reporting.progress import ProgressReporter
    from k3artifacts.stores.base import Store

store_option = click.option(
    "--store",
    "store_url",
    envvar="K3A_STORE",
    default=default_store_url,
    show_default="$K3A_STORE or ~/.local/share/k3artifacts/store",
    help="Release store: file:///path (local disk or FSx mount) or s3://bucket/prefix.",
)

policies_option = click.option(
    "--policies",
    "policies_dir",
    envvar="K3A_POLICIES",
    default=lambda: str(default_policies_dir()),
    show_default="$K3A_POLICIES or ./policies",
    type=click.Path(file_okay=False, path_type=Path),
    help="Policy directory (promotion-gates.yaml, licenses/, code-reviews/, signing/) of the "
    "checkout.",
)

signing_key_option = click.option(
    "--signing-key",
    envvar="K3A_SIGNING_KEY",
    show_envvar=True,
    help="PEM private key (ECDSA P-256/P-384) to sign with; its passphrase, if any, from "
    "K3A_SIGNING_KEY_PASSWORD.",
)

def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # The group reports a failure as JSON too (k3artifacts.cli.app).
    if value:
        ctx.meta[JSON_META] = True
    return value


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_remember_json,
    help="Print one JSON document on stdout (for scripts); a failure prints "
    '{"error", "exit_code", "next"}.',
)


def progress_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--progress-interval`` and ``--log-format``, for commands that report long work."""
    fn = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        envvar="K3A_LOG_FORMAT",
        default="text",
        show_default=True,
        help="Progress and log lines on stderr as text or as JSON objects ($K3A_LOG_FORMAT); "
        "json gives lines even on a terminal.",
    )(fn)
    return click.option(
        "--progress-interval",
        type=click.FloatRange(min=0.05),
        envvar="K3A_PROGRESS_INTERVAL",
        default=DEFAULT_INTERVAL,
        show_default=True,
        metavar="SECONDS",
        help="When stderr is not a terminal (a Job, CI, a Prefect worker): one progress line "
        "every SECONDS ($K3A_PROGRESS_INTERVAL).",
    )(fn)


def reporter(
    phase: str, *, quiet: bool, as_json: bool, interval: float, log_format: str
) -> ProgressReporter:
    """The progress display of a command: none with -q, no bar under --json (a script reads
    stdout; periodic lines on stderr still help its logs)."""
    from k3artifacts.reporting.progress import make_reporter

    mode = "lines" if as_json else "auto"
    return make_reporter(phase, mode=mode, interval=interval, log_format=log_format, quiet=quiet)


def get_store(url: str, *, must_exist: bool = True) -> Store:
    """Open the store at ``url``; a store that does not exist is an error (exit 7) unless the
    command creates stores (``must_exist=False``: stage, demo).

    A mistyped path or bucket would otherwise read as an empty store ("no channels yet").
    The check is also the first contact with an S3 endpoint, which fails fast when the
    endpoint cannot be reached at all."""
    from k3artifacts.stores.registry import open_store

    store = open_store(url)
    if not store.exists() and must_exist:
        raise NotFound(
            f"no store at {store.url}",
            hint="check --store / K3A_STORE (a typo?); a store is created by its first "
            "`k3a stage` (or `k3a demo`)",
        )
    return store


def emit(as_json: bool, payload: Any, human: Callable[[], None]) -> None:
    """``payload`` as the command's JSON document for scripts, or call ``human`` to print for
    people. The group prints the document when the command ends, with the error merged in
    when it fails (a verify that found a bad file), so stdout holds exactly one document."""
    if not as_json:
        human()
        return
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        print_document(payload)
    else:
        ctx.meta[DOCUMENT_META] = payload


def resumable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """For commands whose interrupted work a re-run resumes: Ctrl-C says so."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        set_interrupt_hint(RESUME_HINT)
        return fn(*args, **kwargs)

    return wrapper


class ByteSize(click.ParamType):
    """Sizes like 64MiB, 4GiB, 1.5GB or plain bytes."""

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
