"""A release named on the command line: a tuple id, or a channel whose pointer names one."""

from __future__ import annotations

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.releases.channels import CHANNEL_NAME, HistoryEntry, read_state
from k3artifacts.releases.tuples import TUPLE_ID, ReleaseTuple, TupleStore
from k3artifacts.stores.records import RecordStore


def resolve_tuple(store: RecordStore, name: str) -> ReleaseTuple:
    """``name`` is a tuple id, or a channel whose pointer (read and checked as every channel
    reader does) names one. The tuple is re-derived from its body: a tampered one is refused."""
    return resolve_with_move(store, name)[0]


def resolve_with_move(store: RecordStore, name: str) -> tuple[ReleaseTuple, HistoryEntry | None]:
    """:func:`resolve_tuple`, with the channel move that made the tuple current when ``name``
    is a channel (who moved it, and the policy version that judged it), else None."""
    move = None
    if not TUPLE_ID.match(name):
        if not CHANNEL_NAME.match(name):
            raise ConfigError(f"{name!r} is neither a tuple id nor a channel name")
        pointer = read_state(store, name).pointer
        if pointer is None:
            raise NotFound(
                f"{name!r} is not a tuple id and there is no channel {name} in {store.url}",
                hint="pass a tuple id (`k3a tuple list`) or an existing channel",
            )
        name, move = pointer.tuple_id, pointer.entry
    return TupleStore(store).get(name), move
