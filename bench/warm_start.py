"""Figure 13: warm start. ``torch.compile`` of a six-block transformer in a fresh process,
cold (empty ``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR``), then with the caches that
run left, captured with ``k3a warm capture`` into a file store and brought back by ``k3a warm
use`` (pull, verify, copy) into another directory; then the same with one cache blob
corrupted in the store, which must be a named miss (``corrupt``), the child compiling cold.

    python -m bench --only warm                 # a CUDA GPU: max-autotune, Triton kernels
    python -m bench --only warm --device cpu    # no GPU: inductor's C++ codegen, to try it

Target: warm <= 0.3 x cold. PyTorch is imported only by the child processes; without a CUDA
GPU (or PyTorch) the figure is skipped with the reason, never failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from .env import Bench, Row
from .staging import Options
from .tools import k3a_json, trusting_policy

TARGET = 0.3

_CHILD = r"""
import json, sys, time
import torch
from torch import nn
device = sys.argv[1]

class Block(nn.Module):
    def __init__(self, d, heads=8):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))

torch.manual_seed(0)
d = 512 if device == "cuda" else 128
model = nn.Sequential(*[Block(d) for _ in range(6)]).to(device).eval()
x = torch.randn(4, 256 if device == "cuda" else 32, d, device=device)
compiled = torch.compile(model, mode="max-autotune" if device == "cuda" else "default")
started = time.perf_counter()
with torch.no_grad():
    y = compiled(x)
if device == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"seconds": time.perf_counter() - started, "sum": float(y.float().sum())}))
"""

_PROBE = ("import json, torch; print(json.dumps({'cuda': torch.cuda.is_available(), "
          "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")


def _skip(why: str) -> list[Row]:
    print(f"warm start figure skipped: {why}", file=sys.stderr)
    return [Row("warm start (torch.compile)", 0.0, "s", target=f"<= {TARGET} x cold",
                note=f"skipped: {why}")]


def _compile(bench: Bench, device: str, caches: Path) -> float:
    env = dict(bench.env, TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
               TRITON_CACHE_DIR=str(caches / "triton"))
    out = subprocess.run([sys.executable, "-c", _CHILD, device], env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"compile child failed: {out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def warm_start(bench: Bench, opts: Options, shared: dict) -> list[Row]:
    device = opts.device
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        return _skip("PyTorch is not installed in this Python "
                     f"({probe.stderr.strip().splitlines()[-1] if probe.stderr else '?'})")
    found = json.loads(probe.stdout)
    if device == "cuda" and not found["cuda"]:
        return _skip("no CUDA GPU here; run it on a GPU machine, or try --device cpu")
    gpu = found["gpu"] if device == "cuda" else "cpu"
    # A tuple to bind the caches to: a tiny published revision (the weights do not matter).
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(bench.fresh("warm-store"))
    release = Releases(store, bench.fresh("warm-scratch")).release()
    bench.env["K3A_STORE"] = store.url
    key = trusting_policy(bench, store.url)
    cold_dir = bench.fresh("warm-cold")
    bench.log(f"warm: cold compile on {gpu}")
    cold = _compile(bench, device, cold_dir)
    started = time.perf_counter()
    # On the CPU inductor writes no Triton kernels: capture the directories that exist.
    roots = [f"{n}={cold_dir / n}" for n in ("inductor", "triton") if (cold_dir / n).is_dir()]
    captured = k3a_json(bench, "warm", "capture", release.id, "--gpu", gpu, "--signing-key",
                    str(key), *roots)
    capture_s = time.perf_counter() - started
    node, into = bench.fresh("warm-node"), bench.fresh("warm-into")
    started = time.perf_counter()
    used = k3a_json(bench, "warm", "use", release.id, "--gpu", gpu, "--to", str(node),
                "--into", str(into))
    use_s = time.perf_counter() - started
    if not used["ok"]:
        raise RuntimeError(f"warm use missed: {used['reason']}: {used['detail']}")
    bench.log("warm: compile with the pulled caches")
    warm = _compile(bench, device, into)
    # One blob corrupted in the store: the pull must refuse it and the child compile cold.
    manifest = json.loads(store.read(captured["key"]).data)
    victim = max(manifest["files"], key=lambda f: f["size"])
    blob = store.local_path(f"warm/blobs/{victim['sha256'][:2]}/{victim['sha256']}")
    blob.chmod(0o644)
    blob.write_bytes(b"\0" * victim["size"])
    node2, into2 = bench.fresh("warm-node2"), bench.fresh("warm-into2")
    missed = k3a_json(bench, "warm", "use", release.id, "--gpu", gpu, "--to", str(node2),
                  "--into", str(into2))
    corrupt = _compile(bench, device, into2)
    ratio = warm / cold
    return [
        Row("warm start: cold compile", cold, "s", note=f"{device}, {gpu}"),
        Row("warm start: compile with pulled caches", warm, "s", "cold", cold,
            ratio=round(ratio, 3), target=f"<= {TARGET} x cold", passed=ratio <= TARGET,
            note=f"{captured['files']} files, {captured['bytes']:,} bytes; capture "
                 f"{capture_s:.1f}s, pull+verify+copy {use_s:.1f}s"),
        Row("warm start: one blob corrupted", corrupt, "s", "cold", cold,
            ratio=round(corrupt / cold, 3), target="a named miss; compiles cold",
            passed=missed["reason"] == "corrupt" and not missed["ok"],
            note=f"miss: {missed['reason']}: {missed['detail']}"),
    ]
