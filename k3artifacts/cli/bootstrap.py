"""``k3a bootstrap``: set up a store once. The store its URL names says which setup
(``stores/registry.py:SETUPS``): an S3 bucket's settings (``cli/aws.py``) or a file store shared
by a Unix group (``stores/file_bootstrap.py``)."""

from __future__ import annotations

from typing import Any

import click

from k3artifacts.cli.common import emit, json_option
from k3artifacts.cli.exits import exits

FORMS = ("s3://BUCKET[/PREFIX]", "file:///PATH")


class ByStore(click.Command):
    """``k3a bootstrap URL ...``: the command of the URL's form, parsed with its own options;
    without a URL, this command's help, then each form's."""

    def _form(self, args: list[str]) -> click.Command | None:
        # The store says how it is set up (stores/registry.py); the first argument that names
        # a store picks the form, whatever options come before it.
        from k3artifacts.stores.registry import setup_named

        for arg in args:
            setup = setup_named(arg)
            if setup == "group":
                return file_bootstrap_cmd
            if setup == "bucket":
                from k3artifacts.cli.aws import bootstrap_cmd

                return bootstrap_cmd
        return None

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        form = self._form(args)
        if form is not None:
            return form.make_context(info_name, args, parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        from k3artifacts.cli.aws import bootstrap_cmd

        for form in (bootstrap_cmd, file_bootstrap_cmd):
            with click.Context(form, info_name=ctx.info_name, parent=ctx.parent,
                               terminal_width=ctx.terminal_width,
                               max_content_width=ctx.max_content_width) as sub:
                formatter.write_paragraph()
                form.format_help(sub, formatter)


def _no_form(url: str | None) -> None:
    where = f"{url!r} is neither" if url else "give"
    raise click.UsageError(f"{where} {' nor '.join(FORMS)}" if url else
                           f"{where} the store to set up: {' or '.join(FORMS)}")


bootstrap_cmd = exits((2, "no URL, or one of neither form (each form's codes follow)"))(ByStore(
    "bootstrap", callback=_no_form,
    params=[click.Argument(["url"], required=False, metavar="URL")],
    short_help="Set up a store: an S3 bucket's settings, or a file store for a group.",
    help="Set up a store once: an S3 bucket's settings and IAM policies, or a file store "
    "shared by a Unix group. The URL chooses; each form's options and exit codes follow.",
))


@exits(
    (0, "done (or dry run shown)"),
    (9, "no such group, this account not in it, the group's members cannot reach PATH, or a path "
        "owned by another account"),
)
@click.command("bootstrap")
@click.argument("store_url", metavar="file:///PATH")
@click.option("--group", required=True,
              help="The Unix group of the accounts that share the store (an administrator "
              "makes it with groupadd and adds each account with usermod -aG).")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@json_option
def file_bootstrap_cmd(store_url: str, group: str, dry_run: bool, as_json: bool) -> None:
    """Share a file store with a Unix group: each account acts as itself, all read the same
    records.

    The root (made if missing) and everything under it get the group; every directory the
    set-group-ID bit; the group what the owner has (records stay read-only, sealed revisions
    sealed); others keep what they had. k3a then writes records the group reads, in
    directories the group may add to, whatever each member's umask. Run it as root or as the
    store's owner, who must be in the group; a second run changes nothing.
    """
    from k3artifacts.stores.file_bootstrap import share

    report = share(store_url, group, dry_run=dry_run)

    def human() -> None:
        url = f"file://{report.root}"
        if report.created:
            click.echo(f"{'would create' if dry_run else 'created'} {report.root}")
        if not report.changed and not report.created:
            click.echo(f"{url}: shared with group {group}; no changes")
        else:
            verb = "would give" if dry_run else "gave"
            click.echo(f"{url}: {verb} group {group} {len(report.changed)} path(s) "
                       "(set-group-ID directories, the owner's access for the group)")
        for link in report.links:
            click.echo(f"left alone: {link} (a symbolic link)")
        if not dry_run:
            click.echo(f"next: members of {group} use the store as themselves; add an "
                       f"account with `usermod -aG {group} ACCOUNT` (it logs in again)")

    emit(as_json, report.as_dict(), human)
