"""The store's nouns as command-line parameters: a tuple id, a channel, a repo id.

Each checks its shape when click parses it, before the command runs, so a malformed id is
refused (exit 2) before anything is made (a personal key, a directory) or read. Each also
completes in the shell (``k3a`` under bash, zsh or fish: docs/reference/cli.md, "Shell
completion") from the store the command line names (``--store``, else the context's or
``K3A_STORE``): a completion reads a few listings and never fails loudly, since a broken
store or a missing setting must not print a traceback into someone's prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

if TYPE_CHECKING:
    from k3artifacts.stores.base import Store


def _store_of(ctx: click.Context) -> Store | None:
    """The store a command line being completed names, or None if there is none there."""
    from k3artifacts.settings import default_store_url
    from k3artifacts.stores.registry import open_store

    url = ctx.params.get("store_url") or default_store_url()
    store = open_store(url)
    return store if store.exists() else None


def _complete(ctx: click.Context, incomplete: str,
              *listings: Callable[[Store], list[str]]) -> list[CompletionItem]:
    try:
        store = _store_of(ctx)
        if store is None:
            return []
        found = sorted({name for listing in listings for name in listing(store)})
    except Exception:  # noqa: BLE001 - a completion says nothing rather than fail in a prompt
        return []
    return [CompletionItem(name) for name in found if name.startswith(incomplete)]


def _tuple_ids(store: Store) -> list[str]:
    from k3artifacts.releases.tuples import TupleStore

    return TupleStore(store).list_ids()


def _channels(store: Store) -> list[str]:
    from k3artifacts.releases.channels import channel_names

    return channel_names(store)


def _repos(store: Store) -> list[str]:
    # models/<org>/<name>/<commit>/...: a revision's files under its repo's two names.
    return ["/".join(key.split("/")[1:3]) for key in store.list_keys("models/")
            if key.count("/") >= 3]


def _tuple_id(value: str) -> str:
    from k3artifacts.releases.tuples import check_tuple_id

    return check_tuple_id(value)


def _repo_id(value: str) -> str:
    from k3artifacts.revisions.refs import check_repo_id

    return check_repo_id(value)


class StoreNoun(click.ParamType):
    """A noun of the store on the command line: its shape checked by ``check`` (a named
    refusal, exit 2) as click parses it, its values completed from the store's ``listings``."""

    def __init__(self, name: str, check: Callable[[str], str] | None,
                 *listings: Callable[[Store], list[str]]):
        self.name = name
        self.check = check
        self.listings = listings

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        return value if self.check is None else self.check(value)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str
                       ) -> list[CompletionItem]:
        return _complete(ctx, incomplete, *self.listings)


#: ``k3t-`` and 24 hex; completes the store's tuples.
TUPLE_ID = StoreNoun("tuple_id", _tuple_id, _tuple_ids)
#: A channel's name; completes the channels the store has pointers for.
CHANNEL = StoreNoun("channel", None, _channels)
#: A tuple id or a channel (each command resolves which); completes both.
TUPLE_OR_CHANNEL = StoreNoun("tuple_or_channel", None, _tuple_ids, _channels)
#: ``org/name``; completes the repos the store has published revisions of.
REPO_ID = StoreNoun("repo_id", _repo_id, _repos)
