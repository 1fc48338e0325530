"""Figure: a node's whole start on a node that holds the revision (issue 42), from the pod's
start to the first token without the model's compile, and how many times it reads the weights.

Setup, untimed: a Llama of tiny architecture whose weights are nearly all of its bytes
(:mod:`.llama`, ``--node-size`` in ``--node-shards``), published on the local hub, staged into
a file store whose policy trusts the bench's key, the revision signed; two signed tuples of it,
one with the profile ``p6-b300-tp8`` (today's pod) and one with ``p6-b300-tp8-k3a``; the
revision pulled onto a node directory once, so the node holds it.

Timed, each step a process as the pod's containers run it, in alternating rounds:

- today: ``k3a pull`` (the ``pull-weights`` container: a copy already on the node is
  re-hashed), ``k3a verify DIR --expect-digest`` (``verify-weights``), then vLLM with its
  default loader;
- k3a: ``k3a pull --verified-by-loader`` (as the ``eks-node-cache`` render runs it for a tuple
  that loads with k3a: the copy on the node is kept on kind and size, not re-hashed), then vLLM
  with ``--load-format k3a``.

vLLM runs as ``vllm.LLM(...).generate`` in a process of the vLLM interpreter (``.venv-vllm``),
``enforce_eager`` (no compile), the engine in that process; its time runs from the process's
start to its first generated token. The path's time is the sum of its steps'.

Bytes a step read: its ``/proc`` io counters and those of every process it waited for
(:mod:`tests.support.own_usage`), the larger of ``rchar`` (bytes through ``read`` calls) and
``read_bytes`` (bytes from the disk). Both are needed: safetensors' loader and k3a's hashing
processes map the files, whose pages pass through no ``read`` call, so before each step the
node's weight files are evicted from the page cache (``posix_fadvise``, those files only; a
node's 1.56 TB is not in memory either) and what the step then reads of them comes from the
disk. From vLLM's steps the same counts of a ``--load-format dummy`` start (no weights read)
are subtracted: its imports and Python files. Reads of the weights = those bytes / the weight
files' bytes.

    python -m bench --only node-start [--node-size 1GiB --node-shards 4] [--node-runs 1]

Target (issue 42): one read of the weights on the k3a path.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from .env import REPO_ROOT, Bench, Child, Row
from .llama import tiny_llama
from .staging import stage_child
from .tools import k3a_json, trusting_policy

REPO = "bench/tiny-llama-wide"
TODAY_PROFILE, K3A_PROFILE = "p6-b300-tp8", "p6-b300-tp8-k3a"
IMAGE = "registry.example/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example/k3a-worker@sha256:" + "1" * 64
PROMPT = [1, 5, 9, 14, 3, 7, 11, 2]

_FIRST_TOKEN = """
import json, sys, time
from vllm import LLM, SamplingParams
model, load_format, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = LLM(model=model, load_format=load_format, model_loader_extra_config=extra,
          skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True,
          gpu_memory_utilization=0.1, seed=0)
out = llm.generate([{"prompt_token_ids": json.loads(sys.argv[4])}],
                   SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), use_tqdm=False)
print(json.dumps({"first_token_at": time.time(), "token": out[0].outputs[0].token_ids[0]}))
"""


@dataclass
class Step:
    name: str
    seconds: float
    rchar: int
    read_bytes: int
    token: int | None = None

    def weight_bytes(self, baseline: Step | None) -> int:
        """What this step read of the weights: the larger of its two counts, less the
        baseline's (a vLLM start that reads no weights)."""
        rchar = self.rchar - (baseline.rchar if baseline else 0)
        disk = self.read_bytes - (baseline.read_bytes if baseline else 0)
        return max(rchar, disk)


def _step(name: str, child: Child, seconds: float | None = None,
          token: int | None = None) -> Step:
    return Step(name, child.seconds if seconds is None else seconds, child.io["rchar"],
                child.io["read_bytes"], token)


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (clean and unmapped after the sync)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Node:
    """The node: its cache directory, the store, the tuples, and how each step is run."""

    def __init__(self, bench: Bench, vllm_python: str, store_url: str, root: Path,
                 revision: Path, digest: str):
        self.bench, self.vllm_python = bench, vllm_python
        self.store_url, self.root, self.revision, self.digest = store_url, root, revision, digest
        self.weights = sorted(revision.glob("*.safetensors"))
        self.vllm_env = dict(bench.env, VLLM_ENABLE_V1_MULTIPROCESSING="0",
                             VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")

    def _settled(self) -> None:
        self.bench.settle()  # --cold: the whole page cache dropped
        evict(self.weights)

    def pull(self, tuple_id: str, extra: list[str]) -> Step:
        self._settled()
        child = self.bench.k3a("pull", tuple_id, "--store", self.store_url, "--to",
                               str(self.root), "--keep", "3", "-q", "--json", *extra)
        return _step("k3a pull", child)

    def verify(self) -> Step:
        self._settled()
        child = self.bench.k3a("verify", str(self.revision), "--expect-digest", self.digest,
                               "-q", "--json")
        return _step("k3a verify", child)

    def vllm(self, load_format: str, extra: dict | None = None) -> Step:
        self._settled()
        child = self.bench.run([self.vllm_python, "-c", _FIRST_TOKEN, str(self.revision),
                                load_format, json.dumps(extra or {}), json.dumps(PROMPT)],
                               env=self.vllm_env)
        said = json.loads(child.stdout.strip().splitlines()[-1])
        return _step(f"vLLM --load-format {load_format}", child,
                     seconds=said["first_token_at"] - child.started_at, token=said["token"])


def _vllm_python(given: str | None) -> str | None:
    for python in ([given] if given else [str(REPO_ROOT / ".venv-vllm" / "bin" / "python")]):
        if Path(python).exists():
            return python
    return None


def _setup(bench: Bench, opts, vllm_python: str) -> tuple[Node, str, str]:
    """The staged, signed revision, its two tuples, and the node holding it."""
    files = tiny_llama(bench, opts.node_size, opts.node_shards)
    commit = bench.publish_on_hub(REPO, files)
    # A new store path each run: the bench's home remembers what it verified of a store at a
    # path, and would take a fresh one there for a store set back.
    store = bench.fresh(f"node-start-store-{uuid.uuid4().hex[:8]}")
    store_url = f"file://{store}"
    with bench.hub() as endpoint:
        stage_child(bench, endpoint, store_url, repo_id=REPO, workers=opts.workers)
    key = trusting_policy(bench, store_url)
    revision = f"{REPO}@{commit}"
    k3a_json(bench, "sign", revision, "--signing-key", str(key), "--store", store_url)
    made = [
        k3a_json(bench, "tuple", "create", revision, "--offline", "--profile", profile,
                 "--image", IMAGE, "--verifier-image", VERIFIER, "--signing-key", str(key),
                 "--store", store_url)["tuple"]
        for profile in (TODAY_PROFILE, K3A_PROFILE)
    ]
    root = bench.fresh("node-start-node")
    pulled = k3a_json(bench, "pull", made[0]["id"], "--store", store_url, "--to", str(root),
                      "-q")
    node = Node(bench, vllm_python, store_url, root, Path(pulled["path"]),
                made[0]["binding"]["weights"]["manifest_digest"])
    return node, made[0]["id"], made[1]["id"]


def _skip(why: str) -> list[Row]:
    print(f"node-start figure skipped: {why}", file=sys.stderr)
    return [Row("node start: reads of the weights", 0.0, "reads", target="1 (k3a path)",
                note=f"skipped: {why}")]


def _describe(steps: list[Step], baseline: Step, weights: int) -> str:
    parts = []
    for s in steps:
        base = baseline if s.name.startswith("vLLM") else None
        parts.append(f"{s.name} {s.seconds:.1f} s, {s.weight_bytes(base) / weights:.2f} reads "
                     f"(rchar {s.rchar / 2**20:,.0f} MiB, disk {s.read_bytes / 2**20:,.0f} MiB)")
    return "; ".join(parts)


def node_start(bench: Bench, opts, shared: dict) -> list[Row]:
    vllm_python = _vllm_python(opts.vllm_python)
    if vllm_python is None:
        return _skip("no vLLM interpreter (.venv-vllm/bin/python, or --vllm-python)")
    node, today_tuple, k3a_tuple = _setup(bench, opts, vllm_python)
    weights = sum(p.stat().st_size for p in node.weights)
    pull_args = ["--verified-by-loader"]
    k3a_extra = {"tuple": k3a_tuple, "store": node.store_url}
    # The first vLLM start in the bench's home fills its caches there (measured: 170 MiB
    # more read than every later start): untimed, so the baseline is a start like the others.
    node.vllm("dummy")
    rounds: list[dict[str, list[Step]]] = []
    for round_ in range(opts.node_runs):
        rounds.append({
            "dummy": [node.vllm("dummy")],
            "today": [node.pull(today_tuple, []), node.verify(), node.vllm("auto")],
            "k3a": [node.pull(k3a_tuple, pull_args), node.vllm("k3a", k3a_extra)],
        })
        for name, steps in rounds[-1].items():
            bench.log(f"node-start round {round_ + 1}: {name} "
                      + _describe(steps, rounds[-1]["dummy"][0], weights))

    def fastest(name: str) -> tuple[list[Step], Step]:
        """The path's fastest round, with that round's vLLM start without weights."""
        best = min(rounds, key=lambda r: sum(s.seconds for s in r[name]))
        return best[name], best["dummy"][0]

    def reads(steps: list[Step], baseline: Step) -> float:
        return sum(s.weight_bytes(baseline if s.name.startswith("vLLM") else None)
                   for s in steps) / weights

    (today, today_base), (k3a, k3a_base) = fastest("today"), fastest("k3a")
    dummy = min((r["dummy"][0] for r in rounds), key=lambda s: s.seconds)
    today_s, k3a_s = sum(s.seconds for s in today), sum(s.seconds for s in k3a)
    today_reads, k3a_reads = reads(today, today_base), reads(k3a, k3a_base)
    same = today[-1].token == k3a[-1].token
    setting = (f"{len(node.weights)} shards, {weights / 2**30:.2f} GiB float32; weights "
               f"evicted from the page cache before each step"
               + (", the whole cache dropped" if bench.cold else "")
               + f"; fastest of {opts.node_runs} round(s)")
    return [
        Row("node start, today: pull + verify + vLLM default loader", today_reads, "reads",
            note=f"{setting}; {_describe(today, today_base, weights)}",
            extra={"seconds": today_s, "steps": [vars(s) for s in today]}),
        Row("node start, k3a: pull + vLLM --load-format k3a", k3a_reads, "reads",
            "today", today_reads, today_reads / k3a_reads, "1 read", round(k3a_reads, 1) <= 1.0,
            note=f"pull {' '.join(pull_args)}; {_describe(k3a, k3a_base, weights)}",
            extra={"seconds": k3a_s, "steps": [vars(s) for s in k3a]}),
        Row("node start to first token, k3a vs today", k3a_s, "s", "today", today_s,
            today_s / k3a_s, "", None,
            note=f"the sum of each path's steps, each from its process's start; vLLM without "
                 f"weights (dummy) {dummy.seconds:.1f} s to its first token; first token "
                 f"{'the same' if same else 'DIFFERS'} ({today[-1].token} / {k3a[-1].token})",
            extra={"dummy_seconds": dummy.seconds}),
    ]
