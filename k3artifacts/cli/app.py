"""The ``k3a`` command group: which module defines each command, and the one place where a
failing command becomes a message (or a ``--json`` document) and an exit code.

A command's module is imported only when that command runs: ``k3a --help`` lists the short
help kept in :data:`COMMANDS` and imports none of them, so it does not pay for the Hub
client, boto3, openai or the renderers. ``tests/test_cli_manners.py`` checks that each entry's
help is the command's own.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from dataclasses import dataclass
from typing import Any

import click

from k3artifacts import __version__
from k3artifacts.cli.exits import exits
from k3artifacts.errors import K3AError

#: What a path given on the command line that cannot be used raises (PermissionError apart).
UNUSABLE_PATH = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
#: ``ctx.meta`` key set by ``--json`` (see :data:`k3artifacts.cli.common.json_option`).
JSON_META = "k3a.json"
#: ``ctx.meta`` key of the JSON document a command made (:func:`k3artifacts.cli.common.emit`).
DOCUMENT_META = "k3a.document"
_NONE = object()


@dataclass(frozen=True)
class Entry:
    #: ``module:attribute`` under ``k3artifacts.cli``.
    target: str
    #: The command's short help, as ``k3a --help`` lists it; empty for a hidden alias.
    help: str = ""
    #: Where ``k3a --help`` lists it; None for an old spelling kept working but not listed.
    section: str | None = None

    def load(self) -> click.Command:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(f"k3artifacts.cli.{module}"), attr)


LIFECYCLE = "Release path"
RELEASES = "Channels and promotion"
OPERATIONS = "Stores, nodes and AWS"

#: Every top-level command: verbs for the steps of the release path, singular nouns
#: (``tuple``, ``channel``, ``revision``, ``cache``...) with verbs below them for the things
#: the steps make. Old spellings stay as hidden aliases so scripts keep working.
COMMANDS: dict[str, Entry] = {
    "demo": Entry("demo:demo_cmd", "Stage a synthetic release from a local hub, end to end.",
                  LIFECYCLE),
    "stage": Entry("stage:stage_cmd", "Download, verify and publish a Hub revision.", LIFECYCLE),
    "verify": Entry("verify:verify_cmd", "Re-hash a published revision or a local copy.",
                    LIFECYCLE),
    "sign": Entry("sign:sign_cmd", "Sign a published revision or a release tuple.", LIFECYCLE),
    "tuple": Entry("tuples:tuple_group", "Release tuples: create, list, show, diff.", LIFECYCLE),
    "render": Entry("tuples:render_cmd", "Render serving manifests from a tuple or a channel.",
                    LIFECYCLE),
    "pull": Entry("pull:pull_cmd", "Put a release's weights on this node's disk, verified.",
                  LIFECYCLE),
    "warm": Entry("warm:warm_group",
                  "Warm-start caches of a tuple: capture, pull, use, list.", LIFECYCLE),
    "smoke": Entry("readiness:smoke_cmd", "Check a running endpoint serves the tuple well.",
                   LIFECYCLE),
    "gates": Entry("channels:gates_cmd", "Dry run of the gates a channel requires for a tuple.",
                   RELEASES),
    "promote": Entry("channels:promote_cmd", "Move a channel to a tuple after its gates pass.",
                     RELEASES),
    "rollback": Entry("channels:rollback_cmd", "Point a channel back at a tuple it served before.",
                      RELEASES),
    "channel": Entry("channels:channel_group", "Channel pointers: list, history.", RELEASES),
    "review": Entry("channels:review_group", "Record that you read a tuple's license or code.",
                    RELEASES),
    "eval": Entry("readiness:eval_group", "Evaluation runs of tuples against endpoints.",
                  RELEASES),
    "approve": Entry("channels:approve_cmd",
                     "Answer an approval request under your own identity.", RELEASES),
    "policy": Entry("policy:policy_group",
                    "The store's gate policy: show, init, propose, apply, history.", RELEASES),
    "key": Entry("trust:key_group", "The key you sign records with: create, show.", RELEASES),
    "trust": Entry("trust:trust_group", "The store's root of trust, pinned here: init, show, "
                   "rotate.", RELEASES),
    "traffic": Entry("traffic:traffic_group",
                     "Canary analyses of a tuple's traffic steps (Prometheus).", RELEASES),
    "preflight": Entry("preflight:preflight_cmd",
                       "Infrastructure checks of a channel for a tuple, recorded.", RELEASES),
    "scan": Entry("scan:scan_group", "The serving image's vulnerability scan, recorded.",
                  RELEASES),
    "revision": Entry("revisions:revision_group",
                      "Published revisions in the store: list, gc.", OPERATIONS),
    "cache": Entry("pull:cache_group", "The node cache: list, rm, gc, lease.", OPERATIONS),
    "bootstrap": Entry("bootstrap:bootstrap_cmd",
                       "Set up a store: an S3 bucket's settings, or a file store for a group.",
                       OPERATIONS),
    "fsx": Entry("aws:fsx_group", "FSx for Lustre file systems linked to the bucket.",
                 OPERATIONS),
    "docker": Entry("docker:docker_group", "Inputs for the images in docker/.", OPERATIONS),
    "config": Entry("config:config_group",
                    "Named contexts (store, key, channel): list, show, use, set-context.",
                    OPERATIONS),
    # Old spellings.
    "tuples": Entry("tuples:tuple_group"),
    "channels": Entry("channels:channel_group"),
    "history": Entry("channels:history_cmd"),
    "revisions": Entry("revisions:revision_list"),
    "gc": Entry("gc:gc_cmd"),
}


class AliasGroup(click.Group):
    """A group whose ``aliases`` (old spelling -> command name) work but are not listed."""

    def __init__(self, *args: Any, aliases: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.aliases = aliases or {}

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(name, name))


class K3AGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, entry in COMMANDS.items() if entry.section]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        return entry.load() if entry else None

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        # Commands load lazily, so click's own suggestion (from ``self.commands``, which
        # subgroups fill) has nothing to compare a mistyped name with here.
        name = args[0] if args else ""
        if (name and not name.startswith("-") and not ctx.resilient_parsing
                and name not in COMMANDS):
            close = difflib.get_close_matches(name, self.list_commands(ctx))
            if close:
                raise click.UsageError(
                    f"No such command {name!r}. Did you mean "
                    + " or ".join(repr(c) for c in close) + "?", ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = max(len(name) for name in self.list_commands(ctx))
        for section in (LIFECYCLE, RELEASES, OPERATIONS):
            rows = [(n.ljust(width), e.help) for n, e in COMMANDS.items() if e.section == section]
            with formatter.section(section):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        raw_args = [*ctx._protected_args, *ctx.args]
        try:
            rv = super().invoke(ctx)
        except K3AError as exc:
            _fail(ctx, str(exc), exc.exit_code, exc.hint, as_json=_wants_json(ctx, raw_args))
        except PermissionError as exc:
            # A path outside a store (an --out directory, a demo's files): the store's own are
            # refused by name where they are met (stores/file_modes.py).
            where = exc.filename or "a path"
            _fail(ctx, f"this account may not use {where}: {exc.strerror or exc}", 9,
                  f"see who may (`ls -ld {where}`), or choose a path this account owns",
                  as_json=_wants_json(ctx, raw_args))
        except UNUSABLE_PATH as exc:
            # A path given (an --out, --dir or key file) that is not there or not what it
            # must be: named with its cause, as a store path that cannot be made is.
            if exc.filename is None:
                raise
            _fail(ctx, f"cannot use {exc.filename}: {exc.strerror or exc}", 9,
                  f"check the path (`ls -ld {exc.filename}`), or choose another",
                  as_json=_wants_json(ctx, raw_args))
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group named alone: its help, as click prints it
        except click.ClickException as exc:
            # A usage error, or a malformed variable met computing a default: the message and
            # the next step as every other failure says them (with --json, as a document).
            where = getattr(exc, "ctx", None) or ctx
            hint = getattr(exc, "hint", None) or f"see `{where.command_path} --help`"
            as_json = _wants_json(ctx, raw_args)
            if isinstance(exc, click.UsageError) and not as_json:
                click.echo(where.get_usage(), err=True)
            _fail(ctx, exc.format_message(), exc.exit_code, hint, as_json=as_json)
        document = ctx.meta.pop(DOCUMENT_META, _NONE)
        if document is not _NONE:
            print_document(document)
        return rv


def _wants_json(ctx: click.Context, raw_args: list[str]) -> bool:
    if ctx.meta.get(JSON_META):
        return True
    # A usage error (or an error in an option's default) may stop parsing before --json's
    # callback runs.
    before_separator = raw_args[: raw_args.index("--")] if "--" in raw_args else raw_args
    return "--json" in before_separator


def print_document(payload: Any) -> None:
    from k3artifacts.canonical import to_plain

    click.echo(json.dumps(to_plain(payload), indent=2, sort_keys=True, default=str))


def _fail(ctx: click.Context, message: str, exit_code: int, hint: str | None, *,
          as_json: bool) -> None:
    """One failure report: under --json one document on stdout (the command's own, if it made
    one, with the error's keys added), always the message and the next step on stderr; then
    the exit code. A URL's credentials (a password, a signature) are never shown."""
    from k3artifacts.net.redact import redact_text

    message, hint = redact_text(message), None if hint is None else redact_text(hint)
    if as_json:
        error = {"error": message, "exit_code": exit_code, "next": hint}
        document = ctx.meta.pop(DOCUMENT_META, _NONE)
        if document is _NONE:
            print_document(error)
        else:
            from k3artifacts.canonical import to_plain

            plain = to_plain(document)
            print_document({**plain, **error} if isinstance(plain, dict)
                           else {**error, "result": plain})
    print_failure(message, hint)
    sys.exit(exit_code)


def print_failure(message: str, hint: str | None) -> None:
    """``error: MESSAGE`` (red on a terminal, unless NO_COLOR) and ``next: HINT`` on stderr."""
    from k3artifacts.settings import no_color

    click.secho(f"error: {message}", fg="red", err=True, color=False if no_color() else None)
    if hint:
        click.echo(f"next: {hint}", err=True)


def _choose_context(ctx: click.Context, param: click.Parameter, name: str | None) -> None:
    # Called without the flag too: a process running several commands (tests, a flow) must
    # not keep the previous one's choice.
    from k3artifacts.settings import choose_context

    choose_context(name)


@exits(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 130)
@click.group(
    cls=K3AGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="k3a")
@click.option("--context", metavar="NAME", default=None, expose_value=False, is_eager=True,
              callback=_choose_context,
              help="Read the store, identity key and channel from this context of "
              "$XDG_CONFIG_HOME/k3a/config.yaml (else K3A_CONTEXT, else its current-context); "
              "flags and variables override it. `k3a config list` shows them.")
def cli() -> None:
    """Stage Kimi K3 (or any Hugging Face safetensors model) into a verified, pinned release.

    \b
    Typical path:
      k3a demo                                   # try it all locally, no network needed
      k3a stage moonshotai/Kimi-K3 --revision main --store s3://bucket/k3a
      k3a verify moonshotai/Kimi-K3@<commit>     # on a node, before serving
    """
    # The library's log records (retries, mostly) reach stderr in every command; commands
    # with --log-format set it again from the option.
    from k3artifacts.reporting.logs import configure_logging
    from k3artifacts.settings import load

    settings = load()
    if settings.no_color:
        # Every context below this one inherits it: click.secho then writes no colour.
        click.get_current_context().color = False
    configure_logging(settings.log_format)
