"""Figure: the verified load (issue 42). What ``--load-format k3a`` does to a node's copy of the
weights, into GPU memory, against the same loader without hashing and the loaders vLLM ships.

A synthetic bf16 checkpoint (``--load-size``, ``--load-shards``; kept under the workdir between
runs, its xxh3-128 digests beside it as the manifest would hold them) is loaded by, in
alternating rounds (best and median of ``--load-runs``):

- k3a, verified: :func:`k3artifacts.loading.stream.stream_tensors`, every file hashed while it
  is read, every tensor handed over only once its file matched;
- k3a without hashing: the same reader, ``hashing=False`` (target: verified <= 1.05 of it);
- fastsafetensors (``--load-format fastsafetensors``): its ``ParallelLoader`` exactly as vLLM
  0.32 calls it (one group, ``nogds``, queue 0), where the package is installed;
- ``safetensors.torch.load_file(device="cuda")``, file after file, and on 4 threads.

Each side ends when every tensor is in GPU memory (a device synchronise). Beside them, the
machine's pinned host-to-device copy rate, measured in the same run: the ceiling any loader
from host memory has. ``--device cpu`` loads into host memory (no GPU, no fastsafetensors): the
hashing's cost on a machine without one.

    python -m bench --only load [--load-size 16GiB --load-shards 16] [--load-runs 3] [--cold]
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .env import Bench, Row, cache_note

GB = 1e9
#: Tensors of each shard: a few large matrices and the small vectors real checkpoints carry.
_ROWS, _COLS = 4096, 7168


def _write_shard(path: Path, nbytes: int, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    big = _ROWS * _COLS * 2
    tensors, used, i = [], 0, 0
    while used + big <= nbytes:
        tensors.append((f"model.layers.{seed}.mlp.w{i}.weight", [_ROWS, _COLS], big))
        tensors.append((f"model.layers.{seed}.norm{i}.weight", [_COLS], _COLS * 2))
        used += big + _COLS * 2
        i += 1
    header, offset = {}, 0
    for name, shape, n in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    block = rng.integers(0, 2**63, size=big // 8, dtype=np.uint64).view(np.uint8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for k, (_, _, n) in enumerate(tensors):
            fh.write(np.roll(block[:n], k * 4099).tobytes() if n == big else block[:n].tobytes())


def checkpoint(bench: Bench, size: int, shards: int):
    """The synthetic checkpoint's shards (with their xxh3-128), written once per size."""
    import xxhash

    from k3artifacts.loading.stream import Shard

    where = bench.workdir / f"load-{size}-{shards}"
    manifest = where / "digests.json"
    if not manifest.exists():
        bench.log(f"load: writing {shards} shards of {size / shards / GB:.2f} GB under {where}")
        where.mkdir(parents=True, exist_ok=True)
        paths = [where / f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        with ThreadPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:
            list(pool.map(lambda a: _write_shard(a[1], size // shards, a[0]),
                          enumerate(paths)))

        def digest(path: Path) -> str:
            h = xxhash.xxh3_128()
            with open(path, "rb", buffering=0) as fh:
                while block := fh.read(8 << 20):
                    h.update(block)
            return h.hexdigest()

        with ThreadPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:
            digests = dict(zip([p.name for p in paths], pool.map(digest, paths), strict=True))
        manifest.write_text(json.dumps(digests))
    digests = json.loads(manifest.read_text())
    return [Shard(name, where / name, (where / name).stat().st_size, xxh)
            for name, xxh in sorted(digests.items())]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _k3a(shards, hashing: bool, threads: int, device: str):
    from k3artifacts.loading.stream import stream_tensors

    def side() -> None:
        for _name, _tensor in stream_tensors(shards, device, threads=threads, hashing=hashing):
            pass
        _sync(device)

    return side


def _load_file(shards, threads: int, device: str):
    import safetensors.torch

    def one(shard) -> None:
        # On the CPU load_file maps the file: touch every byte, as a copy into memory would.
        for tensor in safetensors.torch.load_file(shard.path, device=device).values():
            if device == "cpu":
                tensor.clone()

    def side() -> None:
        if threads == 1:
            for shard in shards:
                one(shard)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, shards))
        _sync(device)

    return side


def _fastsafetensors(shards):
    import torch
    from fastsafetensors import SingleGroup
    from fastsafetensors.parallel_loader import ParallelLoader

    def side() -> None:
        loader = ParallelLoader(pg=SingleGroup(), hf_weights_files=[str(s.path) for s in shards],
                                queue_size=0, use_tqdm_on_load=False, device="cuda:0",
                                nogds=True)
        try:
            for _name, _tensor in loader.iterate_weights():
                pass
        finally:
            loader.close()
        torch.cuda.synchronize()

    return side


def pinned_copy_rate(nbytes: int = 1 << 30, runs: int = 5) -> float:
    """GB/s of one pinned host buffer copied to the GPU, best of ``runs``."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - start) / GB)
    return best


def load(bench: Bench, opts, shared: dict) -> list[Row]:
    import torch

    device = opts.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("the load figure loads into GPU memory: no CUDA device here "
                         "(--device cpu loads into host memory instead)")
    shards = checkpoint(bench, opts.load_size, opts.load_shards)
    total = sum(s.size for s in shards)
    threads = opts.load_threads
    sides = {
        "k3a verified": _k3a(shards, True, threads, device),
        "k3a, no hashing": _k3a(shards, False, threads, device),
        "safetensors load_file": _load_file(shards, 1, device),
        "safetensors load_file, 4 threads": _load_file(shards, 4, device),
    }
    if device == "cuda":
        try:
            sides["fastsafetensors"] = _fastsafetensors(shards)
        except ImportError as exc:
            bench.log(f"load: fastsafetensors not installed ({exc}); its side is left out")
    h2d = pinned_copy_rate() if device == "cuda" else None
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(opts.load_runs):
        for name, side in sides.items():
            bench.settle([s.path for s in shards])
            start = time.perf_counter()
            side()
            times[name].append(time.perf_counter() - start)
            if device == "cuda":
                torch.cuda.empty_cache()
            bench.log(f"load round {round_ + 1}: {name} {times[name][-1]:.2f} s")
    best = {name: min(t) for name, t in times.items()}
    rate = {name: total / t / GB for name, t in best.items()}
    medians = {name: statistics.median(t) for name, t in times.items()}
    verified = best["k3a verified"]
    note = (f"{len(shards)} shards, {total / GB:.2f} GB bf16, {threads} threads, "
            f"{cache_note(bench)}; best of {opts.load_runs} (medians: "
            + ", ".join(f"{n} {m:.2f} s" for n, m in medians.items())
            + "); " + (torch.cuda.get_device_name() if device == "cuda" else "into host memory"))
    rows = [
        Row(f"load: k3a verified into {device} memory", rate["k3a verified"], "GB/s",
            "pinned host-to-device copy" if h2d else "", h2d,
            rate["k3a verified"] / h2d if h2d else None, note=note),
        Row("load: verified / same loader unhashed", verified, "s", "k3a, no hashing",
            best["k3a, no hashing"], verified / best["k3a, no hashing"], "<= 1.05",
            verified / best["k3a, no hashing"] <= 1.05),
    ]
    for peer in ("fastsafetensors", "safetensors load_file",
                 "safetensors load_file, 4 threads"):
        if peer in best:
            rows.append(Row(f"load: verified / {peer}", verified, "s", peer, best[peer],
                            verified / best[peer], "<= 1.0", verified <= best[peer],
                            extra={"peer_gb_s": rate[peer]}))
    return rows
