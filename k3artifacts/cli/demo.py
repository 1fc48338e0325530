"""k3a demo: the whole staging path on this machine, no network, no AWS account."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    ByteSize,
    default_workers,
    emit,
    get_store,
    json_option,
    progress_options,
    resumable,
    store_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.stage import print_stage_result, run_stage, unreviewed_staged_code

if TYPE_CHECKING:
    from k3artifacts.localhub import LocalHub
    from k3artifacts.stores.base import Store


DEMO_REPO = "demo/Kimi-K3-synthetic"
#: A serving image given by digest, so the demo's path needs no registry (`--offline`).
DEMO_IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
#: The pipeline worker image of the EKS pod's verify init container, likewise by digest.
DEMO_VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64
DEMO_PROFILE = "p6-b300-tp8"


def default_workdir(store: Store) -> Path:
    """Beside the data of the store the demo writes to (a test's or a scratch store keeps
    its demo files with it); the user's data directory for an S3 store."""
    from k3artifacts.settings import data_home

    if store.local_root is not None:
        return store.local_root / ".k3a-demo"
    return data_home() / "demo"


def running_k3a() -> str:
    """The k3a that is running, as a shell line that starts it from any directory: ``k3a``
    when that is what ``PATH`` finds, else this script's full path (the README's first
    command runs ``.venv/bin/k3a`` from a shell that never activated the venv), else this
    interpreter with ``-m``."""
    script = Path(sys.argv[0])
    if script.name != "k3a" or not script.is_file():
        return f"{shlex.quote(sys.executable)} -m k3artifacts"
    found = shutil.which("k3a")
    if found is not None and os.path.samefile(found, script):
        return "k3a"
    return shlex.quote(str(script.absolute()))


def next_steps(commit: str, store_url: str, workdir: Path) -> list[str]:
    """The rest of the README's no-network path, from the revision the demo published, as
    shell lines that run as printed, in order, in the shell that ran the demo."""
    k3a = running_k3a()
    store = f" --store {shlex.quote(store_url)}"
    deploy = shlex.quote(str(workdir / "deploy"))
    return [
        f"TUPLE=$({k3a} tuple create {DEMO_REPO}@{commit} --offline --profile {DEMO_PROFILE} "
        f"--image {DEMO_IMAGE} --verifier-image {DEMO_VERIFIER}{store} | head -1 | cut -d' ' -f1)",
        f'{k3a} review license "$TUPLE"{store}',
        f'{k3a} review code "$TUPLE"{store}',
        f'{k3a} promote "$TUPLE" staging --why demo{store}',
        f"{k3a} render staging --target eks --out {deploy}{store}",
    ]


def files_key(files: dict[str, Path]) -> str:
    return hashlib.sha256(json.dumps(sorted(map(str, files.values()))).encode()).hexdigest()[:12]


def demo_release(workdir: Path, size: int, shards: int, seed: int) -> dict[str, Path]:
    """The synthetic release for these parameters, generated once and reused."""
    key = hashlib.sha256(json.dumps([size, shards, seed]).encode()).hexdigest()[:12]
    out = workdir / f"release-{key}"
    done = out / ".complete.json"
    if done.exists():
        return {p: Path(f) for p, f in json.loads(done.read_text()).items()}
    from k3artifacts.localhub.synthetic import (
        write_release,  # the generator is only needed on a first run
    )

    files = write_release(out, total_bytes=size, shards=shards, seed=seed)
    done.write_text(json.dumps({p: str(f) for p, f in files.items()}))
    return files


def next_upstream_commit(hub: LocalHub, workdir: Path, change: str) -> str:
    """Publish in the demo's hub a commit that differs from its head in ``change`` only, as
    upstream does when it fixes a config: the rest is the head's own blobs, so staging it
    downloads one file and shares the others with the revision already published."""
    from k3artifacts.localhub.synthetic import derive_revision

    head = hub.resolve(DEMO_REPO, "main")
    entries = hub.files(DEMO_REPO, head)
    if change not in entries:
        raise click.UsageError(
            f"--change {change}: not a file of {DEMO_REPO}@{head}; one of: "
            + ", ".join(sorted(entries)))
    blobs = {path: hub.repos.blob_path(entry.sha256) for path, entry in entries.items()}
    files = derive_revision(blobs, workdir / "next" / head, change=change,
                            note=f"after {head}")
    return hub.add_commit(DEMO_REPO, files, message=f"Update {change}")


@exits((0, "staged and verified (or already)"), (4, "the staged copy does not verify"),
       8, (9, "bad store URL"), 130)
@click.command("demo")
@store_option
@click.option("--size", type=ByteSize(), default="64MiB", show_default=True,
              help="Total size of the synthetic checkpoint.")
@click.option("--shards", default=4, show_default=True, help="Number of safetensors shards.")
@click.option("--seed", default=0, show_default=True, help="Changes every byte of the release.")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False), default=None,
              show_default="<store>/.k3a-demo for a file store, else "
              "~/.local/share/k3artifacts/demo",
              help="Where the synthetic release and the local hub's files live.")
@click.option("--next-revision", is_flag=True,
              help="First publish a new upstream commit in the demo's hub that changes one "
              "file (--change), then stage it: try incremental staging.")
@click.option("--change", "change", default="config.json", show_default=True, metavar="FILE",
              help="With --next-revision: the repo file the new commit changes.")
@click.option("--workers", type=int, default=default_workers, show_default="cores, 2 to 8",
              help="Files downloaded at once.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or progress lines.")
@progress_options
@json_option
@resumable
def demo_cmd(store_url, size, shards, seed, workdir, next_revision, change, workers, quiet,
             progress_interval, log_format, as_json):
    """Stage a synthetic Kimi-K3-shaped release from a local hub into the store.

    Writes a multi-shard safetensors checkpoint (with index, config, LICENSE, model card and
    remote code), serves it from a Hub-compatible server on 127.0.0.1, and runs the same code
    as `k3a stage` against it, then `k3a verify`. Re-running is a no-op for the same release.

    \b
    Examples:
      k3a demo                          # 64 MiB into the default local store
      k3a demo --size 4GiB --shards 8   # a staging throughput check
      k3a demo --store s3://bucket/k3a  # with K3A_S3_ENDPOINT_URL for a local S3
      k3a demo --next-revision          # a second upstream commit: only config.json moves
      k3a demo --next-revision --change model.safetensors.index.json
    """
    from k3artifacts.localhub import LocalHub
    from k3artifacts.staging.engine import StageOptions
    from k3artifacts.stores.verify import verify_revision

    store = get_store(store_url, must_exist=False)
    workdir = workdir or default_workdir(store)
    files = demo_release(workdir, size, shards, seed)
    hub = LocalHub(workdir / f"hub-{files_key(files)}")
    if not hub.repos.repo_exists(DEMO_REPO):
        # Once per release: a second commit of the same files would be a new revision.
        hub.add_commit(DEMO_REPO, files)
    upstream = next_upstream_commit(hub, workdir, change) if next_revision else None
    with hub.serve() as endpoint:
        result = run_stage(
            store, DEMO_REPO, "main", endpoint=endpoint, quarantine=None,
            options=StageOptions(workers=workers), as_json=as_json, quiet=quiet,
            progress_interval=progress_interval, log_format=log_format,
        )
    report = verify_revision(store=store, repo_id=DEMO_REPO, commit=result.commit)
    steps = next_steps(result.commit, store.url, workdir)
    payload = dict(result.__dict__, verified=report.ok, hub_repo=DEMO_REPO, next=steps)
    if upstream is not None:
        payload["upstream_commit"] = {"commit": upstream, "changed": change}

    def human() -> None:
        if upstream is not None:
            click.echo(f"upstream:        new commit {upstream} in the demo hub "
                       f"(changed {change})")
        print_stage_result(result, unreviewed_staged_code(store, result))
        outcome = "ok" if report.ok else "FAILED"
        click.echo(f"verify:          {outcome} ({report.algorithm}, {report.files} files)")
        click.echo("next: make a release tuple and render it, no registry or network needed")
        click.echo("      (paste these lines into this shell, in order; reviews are records in "
                   "the store, judged by the store's policy; then to production: "
                   "docs/guides/demo-to-production.md):")
        for step in steps:
            click.echo(f"  {step}")

    emit(as_json, payload, human)
    report.raise_for_problems()
