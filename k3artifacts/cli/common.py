"""What every k3a command shares: the store option, --json output, errors -> exit codes."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from k3artifacts.canonical import to_plain
from k3artifacts.config import default_policies_dir, default_store_url, parse_size
from k3artifacts.errors import K3AError, NotFound
from k3artifacts.reporting.logs import LOG_FORMATS, configure_logging
from k3artifacts.reporting.progress import DEFAULT_INTERVAL, ProgressReporter, make_reporter
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

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (for scripts)."
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
    mode = "lines" if as_json else "auto"
    return make_reporter(phase, mode=mode, interval=interval, log_format=log_format, quiet=quiet)


def get_store(url: str, *, must_exist: bool = True) -> Store:
    """Open the store at ``url``; a store that does not exist is an error (exit 7) unless the
    command creates stores (``must_exist=False``: stage, demo).

    A mistyped path or bucket would otherwise read as an empty store ("no channels yet").
    The check is also the first contact with an S3 endpoint, which fails fast when the
    endpoint cannot be reached at all."""
    store = open_store(url)
    if not store.exists() and must_exist:
        raise NotFound(
            f"no store at {store.url}",
            hint="check --store / K3A_STORE (a typo?); a store is created by its first "
            "`k3a stage` (or `k3a demo`)",
        )
    return store


def emit(as_json: bool, payload: Any, human: Callable[[], None]) -> None:
    """Print ``payload`` as JSON for scripts, or call ``human`` to print for people."""
    if as_json:
        click.echo(json.dumps(to_plain(payload), indent=2, sort_keys=True, default=str))
    else:
        human()


#: Exit code of a run stopped by Ctrl-C (SIGINT), as shells report it.
INTERRUPTED = 130
RESUME_HINT = "re-run the same command to resume: partial and verified files are kept"
RETRY_HINT = "nothing half-written is visible to readers; re-run the same command"


def _exit_interrupted(hint: str) -> None:
    # Straight to the file descriptor: a worker thread may hold sys.stderr's lock mid-line.
    os.write(2, f"\nerror: interrupted (Ctrl-C)\nnext: {hint}\n".encode())
    # At once, as a crash would: waiting for running transfers to drain could take an hour
    # at a multi-GB shard, and every write is already crash-safe (partial files are a prefix,
    # records are created or swapped atomically, a revision is visible only with its manifest).
    os._exit(INTERRUPTED)


def handle_errors(
    fn: Callable[..., Any] | None = None, *, on_interrupt: str = RETRY_HINT
) -> Any:
    """Turn library errors into one clear message on stderr and the documented exit code;
    Ctrl-C exits 130 with ``on_interrupt`` as the next step."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # The library's log records (retries, mostly) reach stderr in every command;
            # commands with --log-format set it again from the option.
            env_format = os.environ.get("K3A_LOG_FORMAT", "text")
            configure_logging(env_format if env_format in LOG_FORMATS else "text")
            previous = None
            if _main_thread():
                previous = signal.signal(signal.SIGINT, lambda *_: _exit_interrupted(on_interrupt))
            try:
                return fn(*args, **kwargs)
            except K3AError as exc:
                click.secho(f"error: {exc}", fg="red", err=True)
                if exc.hint:
                    click.echo(f"next: {exc.hint}", err=True)
                sys.exit(exc.exit_code)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGINT, previous)

        return wrapper

    return decorate(fn) if fn is not None else decorate


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class ByteSize(click.ParamType):
    """Sizes like 64MiB, 4GiB, 1.5GB or plain bytes."""

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
