"""What every k3a command shares: the store option, --json output, progress, sizes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli import RESUME_HINT, set_interrupt_hint
from k3artifacts.cli.app import DOCUMENT_META, JSON_META, print_document, print_failure
from k3artifacts.errors import ConfigError, K3AError, NotFound
from k3artifacts.reporting.logs import LOG_FORMATS
from k3artifacts.reporting.progress import DEFAULT_INTERVAL

if TYPE_CHECKING:
    from k3artifacts.policy.actor import Acting
    from k3artifacts.reporting.progress import ProgressReporter
    from k3artifacts.settings import Settings
    from k3artifacts.stores.base import Store


# The settings module is imported when a command computes its defaults, not when k3a or a
# command's --help starts: validating its model still costs pydantic's import.
def load() -> Settings:
    """:func:`k3artifacts.settings.load`."""
    from k3artifacts import settings

    return settings.load()


def default_store_url() -> str:
    from k3artifacts import settings

    return settings.default_store_url()


def default_workers() -> int:
    from k3artifacts import settings

    return settings.default_workers()


class SettingsRefused(click.ClickException):
    """A malformed environment variable met while click computes a default: refused with the
    exit code of the error it wraps (bad configuration, exit 9), before the command starts."""

    def __init__(self, error: K3AError):
        super().__init__(str(error))
        # click reads the code from the exception it catches: the wrapped error's class decides.
        self.exit_code = error.exit_code
        self.hint = error.hint

    def show(self, file: Any = None) -> None:
        print_failure(self.message, self.hint)


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
    show_default="$K3A_STORE, else the context's store (`k3a config show`), else "
    "~/.local/share/k3artifacts/store",
    help="Release store: file:///path (local disk or FSx mount) or s3://bucket/prefix.",
)

#: Refused, not read: a local directory can propose a policy change, never judge a move or
#: say which release keys are trusted (``K3A_POLICIES`` is not read for either).
local_policies_option = click.option(
    "--policies", "local_policies", default=None, hidden=True,
    type=click.Path(file_okay=False, path_type=Path),
)


def refuse_local_policies(local: Path | None, store: Store, what: str) -> None:
    """ConfigError (exit 9) for a ``--policies`` given where the store's policy decides."""
    if local is None:
        return
    from k3artifacts.policy.change import policy_in_force

    policy = policy_in_force(store)
    raise ConfigError(
        f"--policies {local}: {what} the store's policy ({policy.label()}), not a local "
        "directory",
        hint=f"to change the store's policy: `k3a policy propose {local}`, then `k3a policy "
        "apply REQUEST` (a change that is not provably stricter needs the root's threshold of "
        "signatures: another root identity's `k3a approve REQUEST`)")

def _signing_key(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """The flag's key reference, or the deprecated K3A_SIGNING_KEY's (read by its migration,
    which says once that it is deprecated and until when)."""
    from k3artifacts.migration.signing_variables import signing_key

    try:
        old = signing_key(value)
    except K3AError as exc:
        raise SettingsRefused(exc) from None
    if old.notice is not None:
        click.echo(f"k3a: {old.notice}", err=True)
    return old.reference


signing_key_option = click.option(
    "--signing-key", callback=_signing_key, metavar="KEY",
    help="Key to sign the release with: a PEM private key file (ECDSA P-256/P-384, readable "
    "by you alone; its passphrase from K3A_IDENTITY_KEY_PASSWORD), kms:KEY or a pkcs11: URI. "
    "Its public key counts where the store's policy names it under an identity holding the "
    "release role.",
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
    if not must_exist:
        store.refuse_unmakeable()
    elif not store.exists():
        raise NotFound(
            f"no store at {store.url}",
            hint="check --store / K3A_STORE / the context's store (`k3a config show`; a "
            "typo?); a store is created by its first `k3a stage` (or `k3a demo`)",
        )
    return store


#: ``--by NAME`` is refused, not read: who acts is the identity whose key signs. Kept, hidden,
#: so a script that still passes it is told so rather than failing on an unknown option.
typed_actor_option = click.option("--by", "by", default=None, hidden=True)


def acting_here(store: Store, by: str | None = None) -> Acting:
    """Who acts on ``store`` (``policy/acting.py``), saying on stderr where the personal key
    was made when this is its first use. ``by``: a typed ``--by``, refused (exit 9)."""
    from k3artifacts.policy.acting import acting

    if by is not None:
        raise ConfigError(
            f"--by {by!r}: who acts is the identity whose key signs, never a typed name",
            hint="drop --by: `k3a key show` says which key you sign with and whose it is; to "
            "act as another identity, sign with its key (K3A_IDENTITY_KEY)")
    me = acting(store)
    made = me.made_key
    if made is not None:
        # The key is written at its first signature: said once the command is done, and
        # only if it signed (a refused move leaves no key behind).
        def said() -> None:
            if Path(made).exists():
                click.echo(f"made your personal key: {made} (public half beside it; "
                           "`k3a key show`)", err=True)

        ctx = click.get_current_context(silent=True)
        if ctx is None:
            said()
        else:
            ctx.call_on_close(said)
    return me


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
        from k3artifacts.settings import parse_size

        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
