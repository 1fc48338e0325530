"""Issue 41: a read costs what is new. What `k3a render`, `k3a pull` and the gates of a move
cost as a channel's history grows, on S3 a few ms away.

Setup, untimed: SeaweedFS behind :class:`~bench.delayproxy.DelayProxy`; one synthetic release
published, reviewed and promoted onto ``staging`` (the store's first use: the bench's key is
its root); the history then grown by signed moves (``trust.chain.append``, as a move commits
them, the mover's checkpoint every 16) to 20, 120 and 10,000 entries, the freshness head
re-signed after each (``k3a trust refresh``'s library call).

Timed, with every request held ``--history-delay-ms`` (5) before it reaches SeaweedFS: each
command a whole process, the median of 3, for a client that read the channel before (its
remembered head is the newest: it verifies what is new, here nothing) and for a fresh one (its
pinned root only: it verifies back to the newest checkpoint).

    python -m bench --only history

Target (issue 41): at the 120th move within 1.5x of the 20th.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

from tests.support.seaweed import SeaweedS3

from .delayproxy import DelayProxy
from .env import Bench, Row
from .staging import Options

LENGTHS = (20, 120, 10_000)
RUNS = 3
CHANNEL = "staging"

_GROW = """
import json, sys
from datetime import UTC, datetime
from pathlib import Path
sys.path.insert(0, ".")
from tests.support.releases import Releases
from k3artifacts.stores.registry import open_store
from k3artifacts.policy.acting import acting
from k3artifacts.policy.record import in_force
from k3artifacts.promotion.moves import promote
from k3artifacts.releases.channels import CHECKPOINT_EVERY, HistoryEntry, read_state
from k3artifacts.releases.freshness import refresh
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.trust.chain import append, checkpoint
url, scratch, length = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
store = open_store(url)
state_file = scratch / "tuples.json"
if state_file.exists():
    a, b = json.loads(state_file.read_text())
    me = acting(store)
else:
    rel = Releases(store, scratch / "files")
    ta, tb = rel.release(), rel.release()
    a, b = ta.id, tb.id
    me = acting(store)  # the store's first use: the bench's key becomes its root
    for t in (a, b):
        review_license(store, t, by=me)
        review_code(store, t, by=me)
    promote(store, a, "staging", acting=me)
    state_file.write_text(json.dumps([a, b]))
policy = in_force(store)
chain = read_state(store, "staging", policy=policy).chain
while chain.next_seq <= length:
    head = chain.head.entry
    entry = HistoryEntry(channel="staging", seq=chain.next_seq, action="promote",
                         tuple_id=b if head.tuple_id == a else a, previous_tuple_id=head.tuple_id,
                         who=me.name, who_source="key", when=datetime.now(UTC),
                         policy_digest=policy.digest, policy_version=policy.version)
    chain = append(store, chain, entry, signer=me.signer, identity=me.name)
    if entry.seq % CHECKPOINT_EVERY == 0:
        checkpoint(store, chain, signer=me.signer, identity=me.name)
refresh(store, me.signer)
print(json.dumps({"tuple": chain.head.entry.tuple_id, "seq": chain.head.seq}))
"""


def _fresh_client(bench: Bench, where: Path) -> dict[str, str]:
    """The bench's account as a client that never read the store: its key and pin only."""
    mine = Path(bench.env["XDG_CONFIG_HOME"]) / "k3artifacts"
    shutil.rmtree(where, ignore_errors=True)
    theirs = where / "k3artifacts"
    theirs.mkdir(parents=True, mode=0o700)
    shutil.copytree(mine / "keys", theirs / "keys", copy_function=shutil.copy2)
    shutil.copytree(mine / "trust", theirs / "trust", copy_function=shutil.copy2,
                    ignore=shutil.ignore_patterns("*.heads.json", ".*"))
    return dict(bench.env, XDG_CONFIG_HOME=str(where))


def _commands(tuple_id: str, cache: Path) -> dict[str, list[str]]:
    return {"render": ["render", CHANNEL, "--target", "eks"],
            "pull": ["pull", CHANNEL, "--to", str(cache)],
            "gates": ["gates", tuple_id, CHANNEL]}


def _timed(bench: Bench, tuple_id: str, scratch: Path) -> dict[str, dict[str, float]]:
    """Median seconds of each command, for the remembered and the fresh client."""
    out: dict[str, dict[str, float]] = {}
    for client in ("remembered", "fresh"):
        cache = scratch / f"node-{client}"
        out[client] = {}
        for name, argv in _commands(tuple_id, cache).items():
            times = []
            for _ in range(RUNS):
                env = _fresh_client(bench, scratch / "fresh-config") if client == "fresh" \
                    else bench.env
                if client == "remembered" and not times:
                    bench.k3a(*argv, env=env)  # reads what is new once: the head, remembered
                times.append(bench.k3a(*argv, env=env).seconds)
            out[client][name] = statistics.median(times)
    return out


def history(bench: Bench, opts: Options, shared: dict) -> list[Row]:
    scratch = bench.fresh("history")
    delay = opts.history_delay_ms / 1e3
    results: dict[int, dict[str, dict[str, float]]] = {}
    with SeaweedS3(scratch / "weed") as s3, DelayProxy(s3.endpoint) as proxy:
        bucket = s3.create_bucket("k3a-history")
        bench.env.update(s3.env)
        bench.env["K3A_S3_ENDPOINT_URL"] = proxy.endpoint
        bench.env["K3A_STORE"] = f"s3://{bucket}/k3a"
        try:
            for length in LENGTHS:
                proxy.delay = 0.0
                grown = bench.python(_GROW, bench.env["K3A_STORE"], str(scratch),
                                     str(length)).json()
                bench.log(f"history: staging at #{grown['seq']}")
                proxy.delay = delay
                results[length] = _timed(bench, grown["tuple"], scratch)
        finally:
            for name in ("K3A_S3_ENDPOINT_URL", "K3A_STORE", *s3.env):
                bench.env.pop(name, None)
    rows = []
    first = LENGTHS[0]
    for client in ("remembered", "fresh"):
        for name in ("render", "pull", "gates"):
            base = results[first][client][name]
            for length in LENGTHS[1:]:
                value = results[length][client][name]
                target = "<= 1.5x move 20" if length == 120 else ""
                rows.append(Row(
                    f"k3a {name} at move {length:,}, {client} client", value * 1e3, "ms",
                    f"move {first}", base * 1e3, base / value, target,
                    value / base <= 1.5 if length == 120 else None,
                    note=f"S3 (SeaweedFS) {opts.history_delay_ms:g} ms a request away; "
                         f"median of {RUNS} whole processes"))
    return rows
