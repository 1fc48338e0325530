"""``k3a docker build-args``: the serving image's build args, taken from a release tuple."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import emit, get_store, json_option, store_option
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import TUPLE_OR_CHANNEL

if TYPE_CHECKING:
    from k3artifacts.releases.tuples import ReleaseTuple



def serving_build_args(release: ReleaseTuple) -> dict[str, str]:
    """What docker/serving/Dockerfile takes: the tuple's image by digest, its identity, and
    the worker image whose k3a it installs."""
    b = release.binding
    return {
        "VLLM_IMAGE": b.image.reference,
        "K3A_TUPLE_ID": release.id,
        "K3A_WEIGHTS": f"{b.weights.repo_id}@{b.weights.commit}",
        "K3A_MANIFEST_DIGEST": b.weights.manifest_digest,
        "K3A_LICENSE_SHA256": b.license_sha256 or "",
        "K3A_PROFILE": b.serving.profile,
        # Whose k3a wheel the image installs (the verified load's plugin).
        "K3A_WORKER_IMAGE": b.serving.resources.get("verifier_image") or "",
    }


@click.group("docker")
def docker_group() -> None:
    """Inputs for the images in docker/."""


@exits(
    (0, "printed"),
    (4, "the tuple's body does not match its id (edited in the store)"),
    (7, "unknown tuple or channel"),
)
@docker_group.command("build-args")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@store_option
@json_option
def build_args(tuple_or_channel: str, store_url: str, as_json: bool) -> None:
    """Print the build args of the serving image (docker/serving/Dockerfile) for a tuple.

    TUPLE_OR_CHANNEL is a tuple id (k3t-...) or a channel name (its current tuple). The base
    image comes from the tuple, so it is always repository@sha256:digest. One
    `--build-arg KEY=VALUE` per line, ready for the shell:

    \b
      docker build $(k3a docker build-args k3t-...) -t REPO:k3t-... docker/serving
    """
    from k3artifacts.releases.lookup import resolve_tuple

    release = resolve_tuple(get_store(store_url), tuple_or_channel)
    args = serving_build_args(release)

    def human() -> None:
        for key, value in args.items():
            click.echo(f"--build-arg {key}={value}")

    emit(as_json, {"tuple_id": release.id, "build_args": args}, human)
