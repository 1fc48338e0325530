"""Serve a local hub root in the foreground (for the demo, benchmarks and manual poking).

    python -m k3artifacts.localhub --root /tmp/hub [--port 8765] [--token hf_x]
    python -m k3artifacts.localhub --root /tmp/hub --gated org/name --granted hf_ok
    python -m k3artifacts.localhub --root /tmp/hub --synthetic moonshotai/Kimi-K3 \\
        --total-bytes 2G --shards 4

``--synthetic`` first commits a synthetic Kimi-K3-shaped release to that repo's main branch.
The endpoint is printed on the first line of stdout; stop with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from k3artifacts.localhub import LocalHub

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m k3artifacts.localhub",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--root", type=Path, required=True, help="hub root (created if missing)")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every request")
    ap.add_argument("--gated", metavar="REPO_ID", action="append", default=[],
                    help="serve this repo's files only to tokens granted access (repeatable)")
    ap.add_argument("--granted", metavar="TOKEN", action="append", default=[],
                    help="a token granted access to every gated repo; any other token sent is "
                    "answered 401, as huggingface.co answers a wrong one (repeatable)")
    ap.add_argument("--page-size", type=int, default=1000, help="tree listing page size")
    ap.add_argument("--synthetic", metavar="REPO_ID", help="commit a synthetic release first")
    ap.add_argument("--total-bytes", type=_size, default=64 << 20, help="synthetic tensor bytes")
    ap.add_argument("--shards", type=int, default=2, help="synthetic shard count")
    ap.add_argument("--seed", type=int, default=0, help="synthetic seed")
    args = ap.parse_args(argv)

    hub = LocalHub(args.root, token=args.token, page_size=args.page_size,
                   tokens=args.granted, gated=args.gated)
    for repo_id in args.gated:
        for token in args.granted:
            hub.grant(repo_id, token)
    if args.synthetic:
        from k3artifacts.localhub.synthetic import write_release

        files = write_release(
            args.root / "synthetic-src" / args.synthetic.replace("/", "--"),
            total_bytes=args.total_bytes,
            shards=args.shards,
            seed=args.seed,
        )
        commit = hub.add_commit(args.synthetic, files)
        print(f"# {args.synthetic}@main = {commit}", file=sys.stderr)
    endpoint = hub.start(args.port)
    print(endpoint, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
