"""``k3a tuple create|list|show|diff`` and ``k3a render``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli.common import (
    emit,
    get_store,
    json_option,
    local_policies_option,
    refuse_local_policies,
    signing_key_option,
    store_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import TUPLE_ID, TUPLE_OR_CHANNEL
from k3artifacts.errors import ConfigError, TamperedRecord

if TYPE_CHECKING:
    from k3artifacts.releases.tuples import ReleaseTuple


def _summary(release: ReleaseTuple) -> dict:
    b = release.binding
    return {
        "id": release.id,
        "revision": f"{b.weights.repo_id}@{b.weights.commit}",
        "profile": b.serving.profile,
        "image": b.image.reference,
        "created_at": release.created_at.isoformat(),
        "created_by": release.created_by,
    }


@click.group("tuple")
def tuple_group() -> None:
    """Release tuples: the weights commit, image digest and serving arguments that serving
    consumes. `k3a tuples ...` is the old spelling."""


@exits(
    (0, "created or already present"),
    (7, "revision/image/profile not found"),
    (8, "registry unreachable"),
    (9, "bad reference/profile/options"),
)
@tuple_group.command("create")
@click.argument("revision")
@click.option("--image", "image", required=True, help="Serving image: REPO:TAG or REPO@sha256:...")
@click.option(
    "--profile",
    "profile_name",
    required=True,
    help="Serving profile: a name in manifests/profiles/ or a path to a YAML file.",
)
@click.option(
    "--verifier-image",
    default=None,
    help="Pipeline worker image (contains k3a) for the EKS verify init container.",
)
@click.option(
    "--insecure-registry",
    multiple=True,
    metavar="HOST:PORT",
    help="Reach this registry over plain http (repeatable). Loopback always is.",
)
@click.option(
    "--offline", is_flag=True, help="Contact no registry: images must be given by digest."
)
@click.option(
    "--s3-region", default=None, help="Region of an S3 store (default: the store's or AWS_REGION)."
)
@click.option("--fsx-id", default=None, help="FSx for Lustre file system id holding a file store.")
@click.option("--fsx-dns-name", default=None, help="Its DNS name.")
@click.option("--fsx-mount-name", default=None, help="Its Lustre mount name.")
@click.option(
    "--fsx-mounted-at",
    default=None,
    help="Where its root is mounted here (the store path lies under it).",
)
@signing_key_option
@store_option
@json_option
def tuple_create(
    revision: str,
    image: str,
    profile_name: str,
    verifier_image: str | None,
    insecure_registry: tuple[str, ...],
    offline: bool,
    s3_region: str | None,
    fsx_id: str | None,
    fsx_dns_name: str | None,
    fsx_mount_name: str | None,
    fsx_mounted_at: str | None,
    signing_key: str | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Bind a published REVISION (org/name@<commit>), an image and a profile into a tuple.

    The image tag is resolved to a digest now, once (ECR through boto3, other registries
    through the OCI distribution API); the tuple never holds a tag alone. The tuple id derives
    from the binding only: running this again with the same inputs prints the same id.
    With --signing-key the tuple is signed (releases/tuples/<id>.sig) once it is stored.
    """
    from k3artifacts.serving.tuple_create import create_release_tuple

    created = create_release_tuple(
        get_store(store_url), revision, image, profile_name, verifier_image=verifier_image,
        insecure_registries=insecure_registry, offline=offline, s3_region=s3_region,
        fsx=(fsx_id, fsx_dns_name, fsx_mount_name, fsx_mounted_at), signing_key=signing_key)
    release = created.release
    w = release.binding.weights
    payload = {"created": created.new, "tuple": release.model_dump(mode="json"),
               "signature": created.signature}

    def human() -> None:
        state = "created" if created.new else "already exists"
        click.echo(f"{release.id} ({state})")
        click.echo(f"  revision  {w.repo_id}@{w.commit}")
        click.echo(f"  image     {release.binding.image.reference}")
        click.echo(f"  profile   {release.binding.serving.profile}")
        click.echo(f"  weights   {w.location}")
        if created.signature is not None:
            click.echo(f"  signature {created.signature}")

    emit(as_json, payload, human)


@exits(0, (4, "a tuple's body does not match its id (edited in the store; listed as refused)"),
       (7, "no store there"), 8)
@tuple_group.command("list")
@store_option
@json_option
def tuples_list(store_url: str, as_json: bool) -> None:
    """Every tuple in the store, oldest first. A tuple whose body does not match its id is
    listed as refused instead of being hidden."""
    from k3artifacts.releases.tuples import TupleStore

    tuples = TupleStore(get_store(store_url))
    rows, broken, refusals = [], [], []
    for tuple_id in tuples.list_ids():
        try:
            rows.append(_summary(tuples.get(tuple_id)))
        except TamperedRecord as exc:
            broken.append({"id": tuple_id, "error": str(exc.refusals[0])})
            refusals.append(exc)
    rows.sort(key=lambda r: (r["created_at"], r["id"]))

    def human() -> None:
        if not rows and not broken:
            click.echo("no tuples")
        for r in rows:
            click.echo(f"{r['id']}  {r['created_at'][:19]}  {r['profile']:<24} {r['revision']}")
        for b in broken:
            click.secho(f"{b['id']}  REFUSED  {b['error']}", fg="red")

    emit(as_json, {"tuples": rows, "refused": broken}, human)
    if refusals:
        # The first one's class says what to do (a tampered record: restore it).
        raise type(refusals[0])([r for exc in refusals for r in exc.refusals])


@exits(0, (2, "a malformed tuple id"),
       (4, "the tuple's body does not match its id (edited in the store), or a record its "
           "record log names is gone from the store (RecordMissing) or the log was set back"),
       (7, "no such tuple or no store there"), 8)
@tuple_group.command("show")
@click.argument("tuple_id", type=TUPLE_ID)
@store_option
@json_option
def tuples_show(tuple_id: str, store_url: str, as_json: bool) -> None:
    """One tuple, in full (its id is re-derived from the body: a tampered one is refused),
    with the records made for it (reviews, evaluations, scans, preflights, traffic analyses)
    as its signed record log names them, each still in the store."""
    from k3artifacts.releases.record_log import check_all
    from k3artifacts.releases.tuples import TupleStore, check_tuple_id

    store = get_store(store_url)
    release = TupleStore(store).get(check_tuple_id(tuple_id))
    records = check_all(store, release.id)

    def human() -> None:
        b = release.binding
        click.echo(f"tuple     {release.id}")
        click.echo(f"created   {release.created_at.isoformat()} by {release.created_by}")
        click.echo(f"revision  {b.weights.repo_id}@{b.weights.commit}")
        click.echo(f"manifest  {b.weights.manifest_digest}")
        click.echo(f"weights   {b.weights.location}")
        click.echo(
            f"image     {b.image.reference}" + (f"  (was tag {b.image.tag})" if b.image.tag else "")
        )
        click.echo(f"license   {b.license_sha256 or 'none captured'}")
        click.echo(f"profile   {b.serving.profile}  model path {b.serving.model_path}")
        click.echo("args      " + " ".join(b.serving.args))
        for key, value in sorted(b.serving.env.items()):
            click.echo(f"env       {key}={value}")
        for r in records:
            click.echo(f"record    {r.shown()}")

    emit(as_json, {**release.model_dump(mode="json"),
                   "records": [r.model_dump(mode="json") for r in records]}, human)


@exits((0, "compared (differences or none)"), (2, "a malformed tuple id"),
       (4, "a tuple's body does not match its id (edited in the store)"),
       (7, "no such tuple or no store there"), 8)
@tuple_group.command("diff")
@click.argument("a", type=TUPLE_ID)
@click.argument("b", type=TUPLE_ID)
@store_option
@json_option
def tuples_diff(a: str, b: str, store_url: str, as_json: bool) -> None:
    """What differs between the bindings of tuples A and B."""
    from k3artifacts.releases.tuples import TupleStore, check_tuple_id, diff_bindings

    tuples = TupleStore(get_store(store_url))
    left, right = tuples.get(check_tuple_id(a)), tuples.get(check_tuple_id(b))
    changes = diff_bindings(left.binding, right.binding)
    payload = {"a": a, "b": b, "changes": [{"field": f, "a": x, "b": y} for f, x, y in changes]}

    def human() -> None:
        if not changes:
            click.echo("identical bindings")
        for f, x, y in changes:
            click.echo(f"{f}:\n  - {x}\n  + {y}")

    emit(as_json, payload, human)


class RenderTarget(click.ParamType):
    """A target of :data:`k3artifacts.serving.render.TARGETS`, imported only to check a value
    (not for `k3a render --help`)."""

    name = "target"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:

        from k3artifacts.serving.render import TARGETS

        if value not in TARGETS:
            self.fail(f"{value!r} is not one of {', '.join(TARGETS)}", param, ctx)
        return value


@exits(
    (0, "rendered"),
    (4, "the tuple's body was edited in the store, its signature (--verify-signature) or the "
        "channel's or the policy's history does not verify, or (hyperpod) the weights' place "
        "does not serve the revision as published (an object replaced)"),
    (7, "tuple or channel not found"),
    (9, "the tuple cannot be served on this target (reason and fix printed), a local --policies, "
        "or (--verify-signature) no root pinned for the store"),
)
@click.command("render")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@click.option(
    "--target",
    type=RenderTarget(),
    required=True,
    metavar="TARGET",
    help="hyperpod: InferenceEndpointConfig; eks: PV/PVC, Deployment (or "
    "LeaderWorkerSet), Service, PodDisruptionBudget; eks-node-cache: the same, serving from "
    "the node's NVMe cache; eks-prewarm: a DaemonSet that pulls the tuple into every GPU "
    "node's cache (k3a pull); eks-rollout: the eks pods under an Argo Rollout with the canary "
    "steps and AnalysisTemplate of --rollout-channel's traffic policy.",
)
@click.option(
    "--weights",
    type=click.Choice(["store", "node-cache"]),
    default="store",
    show_default=True,
    help="eks: read the weights from the store's volume, or from the node's NVMe cache "
    "(`k3a pull` in an init container first; same as --target eks-node-cache).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write <name>.<target>.yaml into this directory instead of stdout.",
)
@click.option(
    "--name",
    default=None,
    help="Object name (default: served model name + profile, stable across tuples so "
    "applying a new render updates in place).",
)
@click.option("--namespace", default=None, help="Kubernetes namespace to put in the objects.")
@click.option(
    "--verify-signature",
    is_flag=True,
    help="eks: the init container checks the tuple's and the revision's signatures before the "
    "bytes, with the keys the store's signed policy in force trusts, verified under the root "
    "this client pins (rendered into a ConfigMap with the signing policy as it is now). A "
    "profile with --load-format=k3a needs it (vLLM checks them, and the bytes as it loads: no "
    "init container), on eks and eks-node-cache.",
)
@click.option(
    "--rollout-channel",
    default=None,
    metavar="CHANNEL",
    help="eks-rollout: the channel (in the store's policy) whose `traffic:` policy gives the "
    "canary steps and bounds.",
)
@local_policies_option
@store_option
@json_option
def render_cmd(
    tuple_or_channel: str,
    target: str,
    weights: str,
    out_dir: Path | None,
    name: str | None,
    namespace: str | None,
    verify_signature: bool,
    rollout_channel: str | None,
    local_policies: Path | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Render serving manifests from a tuple (or the tuple a channel points at) alone.

    The output is byte-identical for the same tuple and options, ready for `kubectl apply`.
    """
    from k3artifacts.policy.signing_keys import verifier_trust
    from k3artifacts.releases.lookup import resolve_with_move
    from k3artifacts.serving.render import render
    from k3artifacts.serving.render.placed import check_place
    from k3artifacts.traffic.analysis import channel_traffic

    if weights == "node-cache":
        if target not in ("eks", "eks-node-cache"):
            raise ConfigError(
                f"--weights node-cache is for --target eks, not {target}",
                hint="on HyperPod the operator places the weights: README, 'Node-local cache'",
            )
        target = "eks-node-cache"
    store = get_store(store_url)
    refuse_local_policies(local_policies, store, "trusted release keys come from")
    traffic = None if rollout_channel is None else channel_traffic(store, rollout_channel)
    release, move = resolve_with_move(store, tuple_or_channel)
    check_place(store, release, target)
    rendered = render(release, target, name=name, namespace=namespace,
                      verifier=verifier_trust(store) if verify_signature else None,
                      traffic=traffic)
    text = rendered.text()
    path = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / rendered.filename
        path.write_text(text)
    payload = {
        "tuple_id": rendered.tuple_id,
        "target": target,
        "name": rendered.name,
        "path": str(path) if path else None,
        "documents": rendered.documents,
    }
    if move is not None:
        # Which policy version judged what is rendered: the channel move that made it current.
        payload["channel"] = {"name": move.channel, "seq": move.seq,
                              "policy_version": move.policy_version,
                              "policy_digest": move.policy_digest}
        judged = (f"policy v{move.policy_version} {move.policy_digest[:12]}"
                  if move.policy_digest else "a policy not recorded (a move before policies "
                  "were the store's)")
        click.echo(f"{move.channel} #{move.seq} -> {move.tuple_id}, judged by {judged}",
                   err=True)

    def human() -> None:
        if path is None:
            click.echo(text, nl=False)
        else:
            click.echo(f"{path} ({len(rendered.documents)} objects, tuple {rendered.tuple_id})")

    emit(as_json, payload, human)
