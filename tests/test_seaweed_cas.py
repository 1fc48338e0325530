"""The S3 store's compare-and-swap on a real S3 server (SeaweedFS): in every round of racing
writers exactly one wins, the rest get Conflict, and the winner's bytes are what is stored.
(moto cannot be judged: its conditional writes are not atomic.)"""

from __future__ import annotations

import threading

import pytest

from k3artifacts.errors import Conflict

pytestmark = pytest.mark.s3

WRITERS = 8
#: SeaweedFS makes a losing conditional write wait up to a few seconds: 5 rounds, not 20.
ROUNDS = 5


def _race(fn) -> list[object]:
    barrier = threading.Barrier(WRITERS, timeout=30)
    outcomes: list[object] = [None] * WRITERS

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = fn(i)
        except Conflict as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_racing_replaces_of_one_pointer_have_one_winner_per_round(seaweed_store):
    key = "releases/channels/staging.json"
    token = seaweed_store.replace(key, b"round-0", None)
    for n in range(1, ROUNDS + 1):
        outcomes = _race(lambda i, n=n, token=token: seaweed_store.replace(
            key, f"round-{n}-writer-{i}".encode(), token))
        winners = [i for i, o in enumerate(outcomes) if isinstance(o, str)]
        assert len(winners) == 1, (n, outcomes)
        assert all(isinstance(o, Conflict) for i, o in enumerate(outcomes) if i not in winners)
        stored = seaweed_store.read(key)
        assert stored.data == f"round-{n}-writer-{winners[0]}".encode()
        token = stored.token


def test_racing_creates_of_one_record_have_one_winner_per_round(seaweed_store):
    for n in range(ROUNDS):
        key = f"releases/channels/staging/history/{n + 1}.json"
        outcomes = _race(lambda i, key=key: seaweed_store.create(key, f"writer-{i}".encode()))
        winners = [i for i, o in enumerate(outcomes) if o is None]
        assert len(winners) == 1, (n, outcomes)
        assert seaweed_store.read(key).data == f"writer-{winners[0]}".encode()
