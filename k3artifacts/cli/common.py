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
from k3artifacts.errors import ConfigError, K3AError, NotFound
from k3artifacts.reporting.logs import LOG_FORMATS, configure_logging
from k3artifacts.reporting.progress import DEFAULT_INTERVAL, ProgressReporter, make_reporter
from k3artifacts.settings import default_policies_dir, default_store_url, load, parse_size
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import open_store


class SettingsRefused(click.ClickException):
    """A malformed environment variable met while click computes a default: refused like any
    bad configuration (exit 9), before the command starts."""

    exit_code = ConfigError.exit_code

    def __init__(self, error: K3AError):
        super().__init__(str(error))
        self.hint = error.hint

    def show(self, file: Any = None) -> None:
        click.secho(f"error: {self.message}", fg="red", err=True)
        if self.hint:
            click.echo(f"next: {self.hint}", err=True)


def from_settings(read: Callable[[], Any]) -> Callable[[], Any]:
    """A click default read from :mod:`k3artifacts.settings` (the only reader of the
    environment), so an option and its variable cannot disagree about the variable's name."""

    def default() -> Any:
        try:
            return read()
        except K3AError as exc:
            raise SettingsRefused(exc) from None

    return default


store_option = click.option(
    "--store",
    "store_url",
    default=from_settings(default_store_url),
    show_default="$K3A_STORE or ~/.local/share/k3artifacts/store",
    help="Release store: file:///path (local disk or FSx mount) or s3://bucket/prefix.",
)

policies_option = click.option(
    "--policies",
    "policies_dir",
    default=from_settings(lambda: str(default_policies_dir())),
    show_default="$K3A_POLICIES, else ./policies, else the defaults shipped with k3a",
    type=click.Path(file_okay=False, path_type=Path),
    help="Policy directory of the checkout (promotion-gates.yaml, signing/, eval-suites/, s3/, "
    "iam/).",
)

signing_key_option = click.option(
    "--signing-key",
    default=from_settings(lambda: load().signing_key),
    help="PEM private key (ECDSA P-256/P-384) to sign with; its passphrase, if any, from "
    "K3A_SIGNING_KEY_PASSWORD.  [env var: K3A_SIGNING_KEY]",
)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (for scripts)."
)


def progress_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--progress-interval`` and ``--log-format``, for commands that report long work."""
    fn = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default=from_settings(lambda: load().log_format),
        show_default="text",
        help="Progress and log lines on stderr as text or as JSON objects ($K3A_LOG_FORMAT); "
        "json gives lines even on a terminal.",
    )(fn)
    return click.option(
        "--progress-interval",
        type=click.FloatRange(min=0.05),
        default=from_settings(lambda: load().progress_interval),
        show_default=str(DEFAULT_INTERVAL),
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
            previous = None
            if _main_thread():
                previous = signal.signal(signal.SIGINT, lambda *_: _exit_interrupted(on_interrupt))
            try:
                # The library's log records (retries, mostly) reach stderr in every command;
                # commands with --log-format set it again from the option.
                configure_logging(load().log_format)
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
