"""Serving manifests rendered from a release tuple alone.

The tuple is the only input that decides what runs: weights location, image digest, argv, env
and the profile's resources. The same tuple (and the same naming options) gives byte-identical
YAML on any machine, so a rendered file can be diffed, reviewed and committed; rolling back is
rendering the previous tuple and applying it. One module per target, registered in
:data:`TARGETS` (a new target is a module with a render function and one line there):

* ``hyperpod``: one ``InferenceEndpointConfig`` (``inference.sagemaker.aws.amazon.com/v1``),
  the model source being the tuple's S3 prefix or its FSx path.
* ``eks``: the weights volume (PV + PVC), a Deployment (single node) or a LeaderWorkerSet
  (multi-node, vLLM over Ray), a Service and a PodDisruptionBudget. Every pod runs
  ``k3a verify`` of the bound revision on the mounted weights, under a timeout, before vLLM.
* ``eks-rollout``: the ``eks`` pods under an Argo Rollouts ``Rollout`` that shifts traffic in
  the channel's canary steps, each judged by an ``AnalysisTemplate`` on vLLM's metrics
  (:mod:`.rollout`; needs the channel's ``traffic`` policy).
* ``eks-node-cache``, ``eks-prewarm``: the same pods serving from the node's NVMe after
  ``k3a pull``, and a DaemonSet that pre-pulls a candidate (:mod:`.node_cache`).

Probes, for a server whose cold start reads ~1.5 TB: a startup probe on ``/health`` with a
budget of the profile's ``startup_seconds`` (liveness does not run until it passes, so a slow
load is not killed); readiness asks for a real one-token completion, so a pod whose HTTP server
is up but whose engine cannot generate receives no traffic; liveness on ``/health`` restarts a
dead engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import yaml

from k3artifacts.errors import ConfigError
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.policy.signing_keys import VerifierTrust
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.render.common import default_name, slug
from k3artifacts.serving.render.eks import render_eks
from k3artifacts.serving.render.hyperpod import render_hyperpod
from k3artifacts.serving.render.node_cache import render_eks_node_cache, render_prewarm
from k3artifacts.serving.render.rollout import render_eks_rollout

#: ``render(release, name=..., namespace=...) -> list of Kubernetes objects``, by target name.
TARGETS: dict[str, Callable[..., list[dict]]] = {
    "hyperpod": render_hyperpod,
    "eks": render_eks,
    "eks-rollout": render_eks_rollout,
    "eks-node-cache": render_eks_node_cache,
    "eks-prewarm": render_prewarm,
}


#: Targets whose pods run our verifier, and so can check signatures before serving.
SIGNATURE_TARGETS = ("eks", "eks-rollout", "eks-node-cache")

#: Targets rolled out in steps: they take the channel's traffic policy.
TRAFFIC_TARGETS = ("eks-rollout",)


@dataclass(frozen=True)
class Rendered:
    target: str
    tuple_id: str
    name: str
    documents: list[dict]

    @property
    def filename(self) -> str:
        return f"{self.name}.{self.target}.yaml"

    def text(self) -> str:
        header = (
            f"# Rendered by k3a from release tuple {self.tuple_id} (target {self.target}).\n"
            "# Do not edit: change the tuple (k3a tuple create) and render again.\n"
        )
        body = "---\n".join(
            yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
            for doc in self.documents
        )
        return header + "---\n" + body


def render(
    release: ReleaseTuple,
    target: str,
    *,
    name: str | None = None,
    namespace: str | None = None,
    verifier: VerifierTrust | None = None,
    traffic: TrafficPolicy | None = None,
) -> Rendered:
    """``verifier``: the store's root and release identities in force as this client trusts them
    (:func:`k3artifacts.policy.signing_keys.verifier_trust`): the pods check signatures with
    the keys of that policy, verified under that root (eks only: a HyperPod endpoint has no
    init container of ours; there the signature gate at promotion is the check). ``traffic``:
    the channel's rollout policy, for the targets in :data:`TRAFFIC_TARGETS` (others replace
    the endpoint at once and ignore it)."""
    renderer = TARGETS.get(target)
    if renderer is None:
        raise ConfigError(
            f"unknown render target {target!r}", hint=f"use one of: {', '.join(TARGETS)}"
        )
    name = slug(name) if name else default_name(release)
    extra: dict = {}
    if target in TRAFFIC_TARGETS:
        extra["traffic"] = traffic
    if verifier is not None:
        if target not in SIGNATURE_TARGETS:
            raise ConfigError(
                f"target {target} cannot check signatures in the pod",
                hint="render without --verify-signature; the signature gate checks at promotion",
            )
        extra["verifier"] = verifier
    docs = renderer(release, name=name, namespace=namespace, **extra)
    return Rendered(target=target, tuple_id=release.id, name=name, documents=docs)
