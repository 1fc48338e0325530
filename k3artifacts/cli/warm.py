"""k3a warm: warm-start artifacts (compile and autotune caches bound to a tuple)."""

from __future__ import annotations

from pathlib import Path

import click

from k3artifacts.cli.common import (
    acting_here,
    emit,
    from_settings,
    get_store,
    json_option,
    signing_key_option,
    store_option,
)
from k3artifacts.cli.exits import exits


def _default_root() -> Path:
    from k3artifacts.nodecache.layout import default_root

    return default_root()


gpu_option = click.option(
    "--gpu", default=None,
    help="GPU model as `nvidia-smi --query-gpu=name` prints it  [default: detected with "
    "nvidia-smi]")
tp_option = click.option(
    "--tp", "tp", type=click.IntRange(min=1), default=None,
    help="Tensor-parallel size  [default: the tuple's --tensor-parallel-size]")
channel_option = click.option(
    "--channel", default=None,
    help="Channel whose policy governs the warm start (warm_start, signing)  [default: "
    "TARGET when it is a channel]")
root_option = click.option(
    "--to", "--root", "root", type=click.Path(file_okay=False, path_type=Path),
    default=from_settings(_default_root), show_default="$K3A_NODE_CACHE",
    help="Node cache root; warm artifacts land under ROOT/warm/<tuple>/<gpu>/<layout>/.")


def _channel(target: str, channel: str | None) -> str | None:
    from k3artifacts.releases.channels import CHANNEL_NAME
    from k3artifacts.releases.tuples import TUPLE_ID

    if channel is None and not TUPLE_ID.match(target) and CHANNEL_NAME.match(target):
        return target
    return channel


WARM_HELP = (
    "Warm-start artifacts: a tuple's compile and autotune caches, captured once on the first "
    "node that served it, verified and brought to every node with the weights.\n\n"
    "Caches carried: vllm (VLLM_CACHE_ROOT), triton (TRITON_CACHE_DIR), inductor "
    "(TORCHINDUCTOR_CACHE_DIR), flashinfer (FLASHINFER_WORKSPACE_BASE), deepgemm "
    "(DG_JIT_CACHE_DIR). "
    "docs/guides/warm-start.md says what an artifact holds and why it is safe to run."
)


@click.group("warm", help=WARM_HELP)
def warm_group():
    pass


@exits(
    (0, "captured"),
    2,
    (6, "already captured (first one stands)"),
    (7, "unknown tuple"),
    (8, "store unreachable"),
    (9, "unsafe cache entry, bad key, or your key is no identity of the store's policy or lacks "
        "the role warm"),
)
@warm_group.command("capture")
@click.argument("target")
@click.argument("dirs", nargs=-1, required=True, metavar="NAME=DIR...")
@gpu_option
@tp_option
@channel_option
@store_option
@signing_key_option
@click.option("--if-absent", is_flag=True,
              help="An artifact already captured for this tuple, GPU and layout is success "
              "(the capture Job's restarts), if the channel's rule would use it.")
@json_option
def capture_cmd(target, dirs, gpu, tp, channel, store_url, signing_key, if_absent, as_json):
    """Store cache directories as the warm-start artifact of TARGET (a tuple or channel).

    Each NAME=DIR is one cache directory (NAME: vllm, triton, inductor, flashinfer,
    deepgemm). Files are stored once each under their sha256 (sha256 and xxh3-128 in the
    manifest); the manifest, keyed by the tuple, the GPU model and the parallel layout, is
    created once, a record signed by your key (K3A_IDENTITY_KEY: the capture Job's own; the
    role warm); with --signing-key it also carries a release signature, as a tuple does, for
    channels whose release rule requires one. A link, FIFO or device
    anywhere in a directory, or a path nested deeper than 32 or longer than a node cache path
    may be, refuses the capture (exit 9): nothing is stored.

    An artifact already at the key stands if the channel's rule (the store's policy: its
    warm_start and signing requirements; no channel: signatures wherever any channel requires
    them) would use it; --if-absent then exits 0. One no identity of the policy made (written
    by hand, signed by a key the policy does not trust to capture) is replaced by this
    capture; one lacking the release signature the channel requires (or with an untrusted
    one) is replaced by a capture signed with a key the channel trusts, and refused (exit 6)
    otherwise, --if-absent or not.
    """
    from k3artifacts.warm.capture import capture_target
    from k3artifacts.warm.claim import AlreadyCaptured

    store = get_store(store_url)
    try:
        result = capture_target(store, target, list(dirs), by=acting_here(store), gpu=gpu,
                                tp=tp, signing_key=signing_key,
                                channel=_channel(target, channel))
    except AlreadyCaptured as exc:
        if not (if_absent and exc.usable):
            raise
        shown = str(exc)
        emit(as_json, {"key": exc.key, "already_present": True},
             lambda: click.echo(f"already captured: {shown}"))
        return

    def human() -> None:
        click.echo(f"captured {result.key}: {result.files} files, {result.bytes:,} bytes "
                   f"({result.blobs_new} new blobs, {result.bytes_new:,} bytes stored) in "
                   f"{result.seconds:.1f}s")
        click.echo(f"  manifest digest {result.digest}, recorded by {result.captured_by}"
                   + (f"; release signature by key {result.signed_by[:16]}"
                      if result.signed_by else ""))
        if result.replaced:
            click.echo(f"  replaced the artifact that held the key, which the channel would "
                       f"not use ({result.replaced})")

    emit(as_json, result.__dict__, human)


@exits((0, "pulled, or a named miss (logged, nothing kept)"),
       (4, "the tuple's body does not match its id (edited in the store)"),
       (7, "unknown tuple or channel, or no store there"), 8)
@warm_group.command("pull")
@click.argument("target")
@gpu_option
@tp_option
@channel_option
@store_option
@root_option
@json_option
def pull_cmd(target, gpu, tp, channel, store_url, root, as_json):
    """Bring TARGET's warm artifact for this node's GPU into the node cache, verified.

    The policy is the store's (`k3a policy show`): the channel's warm_start setting and its
    signing rule. Any reason not to (none captured, another GPU or layout, unsigned where
    the channel requires signatures, a corrupted blob) is a named miss: logged, exit 0,
    nothing kept.
    """
    from k3artifacts.releases.lookup import resolve_tuple
    from k3artifacts.warm import prewarm
    from k3artifacts.warm.model import detect_gpu

    store = get_store(store_url)
    release = resolve_tuple(store, target)
    gpu = gpu or detect_gpu()
    trust = prewarm.policy_or_miss(store, _channel(target, channel), release.id, gpu)
    outcome = trust if isinstance(trust, prewarm.WarmOutcome) else \
        prewarm.fetch(store, release, root, gpu=gpu, trust=trust, tp=tp)
    emit(as_json, outcome.as_dict(), lambda: outcome.ok and click.echo(outcome.line()))


@exits((0, "ready, or a named miss: a cold start (a warm start never fails a pod)"))
@warm_group.command("use")
@click.argument("target")
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The server's cache directory: NAME/ for each cache is made here, holding "
              "the verified artifact or nothing.")
@click.option("--no-pull", is_flag=True, help="Use only what the node cache holds.")
@gpu_option
@tp_option
@channel_option
@store_option
@root_option
@json_option
def use_cmd(target, into, no_pull, gpu, tp, channel, store_url, root, as_json):
    """Before the server starts: copy TARGET's pulled warm artifact into --into, each file
    re-verified (xxh3-128) against the store's manifest, held to the channel's policy.

    A miss of any kind leaves empty cache directories (the server compiles cold), logs the
    named reason and exits 0: a warm start never fails a pod. The variables the server needs
    (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, ...) point at --into/NAME either way.
    """
    from k3artifacts.errors import K3AError
    from k3artifacts.releases.lookup import resolve_tuple
    from k3artifacts.warm import prewarm
    from k3artifacts.warm.model import detect_gpu

    gpu = gpu or detect_gpu()
    try:
        store = get_store(store_url)
        release = resolve_tuple(store, target)
    except K3AError as exc:  # no store, no tuple: a cold start, said why, never a failed pod
        env = prewarm.use_cold(into)
        outcome = prewarm.WarmOutcome(target, gpu, "?", ok=False, reason="unavailable",
                                      detail=str(exc), env=env)
        click.echo(f"k3a: {outcome.line()}", err=True)
    else:
        trust = prewarm.policy_or_miss(store, _channel(target, channel), release.id, gpu)
        if isinstance(trust, prewarm.WarmOutcome):
            outcome = trust
            outcome.env = prewarm.use_cold(into)
        else:
            outcome = prewarm.prepare(store, release, root, into, gpu=gpu, trust=trust, tp=tp,
                                      pull=not no_pull)
    emit(as_json, outcome.as_dict(), lambda: outcome.ok and click.echo(outcome.line()))


@exits(0)
@warm_group.command("ls")
@root_option
@json_option
def ls_cmd(root, as_json):
    """Warm artifacts in the node cache (also listed by `k3a cache ls`)."""
    from k3artifacts.warm.node import list_warm

    found = list_warm(root)
    emit(as_json, [c.__dict__ for c in found], lambda: [
        click.echo(f"{c.tuple_id}  {c.gpu}  {c.layout}  {c.files} files  {c.bytes:,} bytes  "
                   f"(weights {c.revision})") for c in found])
