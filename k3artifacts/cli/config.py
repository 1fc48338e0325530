"""``k3a config``: the named contexts of ``$XDG_CONFIG_HOME/k3a/config.yaml`` (a team's staging
and production stores, the key each signs with, the channel each works with), as kubectl's
contexts and AWS's profiles: list, show, use, set-context. The file is read in one place,
:mod:`k3artifacts.settings`, under the environment and the flags."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli.common import emit, json_option
from k3artifacts.cli.exits import exits

if TYPE_CHECKING:
    from k3artifacts.settings import ConfigFile

#: The values a context gives.
FIELDS = ("store", "identity_key", "channel")


@click.group("config")
def config_group() -> None:
    """Named contexts in $XDG_CONFIG_HOME/k3a/config.yaml: store, identity key, channel.

    Chosen by `k3a --context NAME ...`, else K3A_CONTEXT, else the file's current-context
    (`k3a config use NAME`). A flag or a variable of its own overrides what the context says:
    flag > environment > context > default.
    """


def _write(config: ConfigFile) -> None:
    """The file replaced whole, this account's alone (0600 in a 0700 directory)."""
    import yaml

    from k3artifacts.settings import config_file
    from k3artifacts.trust.localfiles import private_dir, write_replacing

    path = config_file()
    private_dir(path.parent)
    text = yaml.safe_dump(config.model_dump(by_alias=True, exclude_none=True), sort_keys=False)
    write_replacing(path, text.encode(), mode=0o600)


@exits((0, "listed"), (9, "a config file refused (writable by others, malformed)"))
@config_group.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """The contexts, the one in use marked with `*`."""
    from k3artifacts.settings import config_file, current_context, read_config_file

    config = read_config_file()
    name, _ = current_context()
    rows = [{"name": n, "current": n == name, **c.model_dump(by_alias=True)}
            for n, c in sorted(config.contexts.items())]

    def human() -> None:
        if not rows:
            click.echo(f"no contexts in {config_file()}; `k3a config set-context NAME "
                       "--store URL` makes one")
        for row in rows:
            mark = "*" if row["current"] else " "
            click.echo(f"{mark} {row['name']:<16} {row['store'] or '-'}")

    emit(as_json, rows, human)


@exits((0, "shown"), (9, "a config file refused, or a context it does not hold"))
@config_group.command("show")
@json_option
def show_cmd(as_json: bool) -> None:
    """What this command line would use, and where each value comes from (flag > environment
    > context > default)."""
    from k3artifacts import settings

    name, _ = settings.current_context()
    shown: dict[str, Any] = {"context": name, "file": str(settings.config_file())}
    for field, (value, source) in settings.context_values().items():
        shown[field] = {"value": value, "from": source}

    def human() -> None:
        click.echo(f"context: {name or '(none)'}  ({shown['file']})")
        for field in FIELDS:
            entry = shown[field]
            click.echo(f"{field.replace('_', '-') + ':':<14} {entry['value'] or '-'}  "
                       f"[{entry['from']}]")

    emit(as_json, shown, human)


@exits((0, "in use from now on"), (9, "no such context, or a config file refused"))
@config_group.command("use")
@click.argument("name")
def use_cmd(name: str) -> None:
    """Make NAME the context every later k3a command reads (the file's current-context)."""
    from k3artifacts.errors import ConfigError
    from k3artifacts.settings import config_file, read_config_file

    config = read_config_file()
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise ConfigError(f"no context {name!r} in {config_file()} (contexts: {known})",
                          hint=f"make it first: `k3a config set-context {name} --store URL`")
    _write(config.model_copy(update={"current_context": name}))
    click.echo(f"using context {name} ({config.contexts[name].store or 'default store'})")


@exits((0, "written"), (2, "a malformed name"), (9, "a config file refused"))
@config_group.command("set-context")
@click.argument("name")
@click.option("--store", "store_url", default=None, help="Store URL of this context.")
@click.option("--identity-key", default=None,
              help="Key records are signed with in this context (PEM file, kms:KEY, pkcs11:).")
@click.option("--channel", default=None, help="Default --channel in this context.")
def set_context_cmd(name: str, store_url: str | None, identity_key: str | None,
                    channel: str | None) -> None:
    """Make or update context NAME with the values given (the others are kept)."""
    from pydantic import ValidationError

    from k3artifacts.errors import UsageError, plain_validation_errors
    from k3artifacts.settings import ConfigFile, Context, read_config_file

    config = read_config_file()
    old = config.contexts.get(name, Context())
    given = {k: v for k, v in {"store": store_url, "identity_key": identity_key,
                               "channel": channel}.items() if v is not None}
    try:
        updated = ConfigFile.model_validate({
            "current-context": config.current_context,
            "contexts": {**{n: c.model_dump(by_alias=True) for n, c in config.contexts.items()},
                         name: old.model_copy(update=given).model_dump(by_alias=True)}})
    except ValidationError as exc:
        raise UsageError(f"context {name!r}: {plain_validation_errors(exc)}",
                         hint="a context name is letters, digits, '.', '_' or '-'") from None
    _write(updated)
    click.echo(f"context {name}: " + ", ".join(
        f"{k.replace('_', '-')} {v}" for k, v in updated.contexts[name].model_dump().items()
        if v is not None))
