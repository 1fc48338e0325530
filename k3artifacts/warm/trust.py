"""Whether a warm artifact may be run: the one gate every use goes through.

These caches hold compiled kernels and generated Python that the server imports and runs, so
an artifact is used only when all of these hold, checked in this order:

* the channel's policy allows warm starts (``warm_start`` in the gate policy in force in the
  store, ``k3a policy show``);
* its manifest is in the store at the key of this tuple, GPU and layout, parses, and is in
  canonical form (so its digest is the digest of what was stored);
* it was captured for this tuple (id, image digest and serving args), this GPU model and this
  tensor/pipeline-parallel layout;
* a signature, where the channel's signing policy requires one (or the warm-start policy asks
  for one), is by a trusted key and over exactly this manifest; a signature present but
  failing to verify is never ignored;
* later, every file matches the manifest's digests (:mod:`.node`).

Anything else is a :class:`WarmMiss` with a named reason: the server starts cold, the reason
is logged, and the pod never fails because of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from k3artifacts.errors import ConfigError
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.signing.attestation import verify_statement
from k3artifacts.signing.dsse import BundleError
from k3artifacts.signing.policy import load_trusted_keys
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import (
    PREDICATE_TYPE,
    WarmManifest,
    artifact_key,
    artifact_prefix,
    gpu_slug,
    layout_name,
    predicate,
    signature_key,
)

#: Every reason a warm artifact is not used (the first word of each miss line).
REASONS = (
    "disabled", "no-gpu", "absent", "foreign-gpu", "other-layout", "malformed", "other-tuple",
    "unsigned", "bad-signature", "corrupt", "not-pulled", "unsafe", "unavailable",
    "no-policy",
)


class WarmMiss(Exception):
    """A warm artifact that will not be used, and why (``reason`` is one of :data:`REASONS`)."""

    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class WarmTrust:
    """What the channel's policy asks of a warm artifact."""

    enabled: bool = True
    require_signature: bool = False
    #: Keys whose signatures count (empty: a signature cannot be checked, so none is asked).
    trusted: dict[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    channel: str | None = None


def warm_trust(document: PolicyDocument, channel: str | None) -> WarmTrust:
    """The channel's warm-start rule: its ``warm_start`` policy and its signing policy. No
    channel (a bare tuple, a pre-warm of a candidate): signatures are required when any
    channel requires them, since the artifact may end up serving there. Never raises over
    the signing policy: a channel that requires signatures and trusts no key gets misses.
    ``document``: the store's policy in force (``k3a policy show``)."""
    gates = document.gates
    rule = gates.channels.get(channel) if channel else None
    warm = rule.warm_start if rule is not None else None
    with document.written_to() as policies_dir:
        try:
            keys = load_trusted_keys(policies_dir)
        except ConfigError:
            keys = None
    if keys is None:
        required, trusted = False, {}
    else:
        if channel is not None:
            required = keys.required(channel)
        else:
            required = any(rule.required for rule in keys.policy.channels.values())
        try:
            trusted = keys.for_channel(channel)
        except ConfigError:
            trusted = {}
    if warm is not None and warm.require_signature:
        required = True
    return WarmTrust(enabled=warm.enabled if warm is not None else True,
                     require_signature=required, trusted=trusted, channel=channel)


@dataclass(frozen=True)
class Trusted:
    manifest: WarmManifest
    raw: bytes
    signature: bytes | None
    signed_by: str | None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


def _why_absent(store: Store, release: ReleaseTuple, gpu: str, layout: str) -> WarmMiss:
    prefix = artifact_prefix(release.id)
    others = sorted(k[len(prefix):].removesuffix(".json")
                    for k in store.list_keys(prefix) if k.endswith(".json"))
    if not others:
        return WarmMiss("absent", f"tuple {release.id} has no warm artifact in {store.url}")
    same_gpu = [o for o in others if o.split("/")[0] == gpu_slug(gpu)]
    reason = "other-layout" if same_gpu else "foreign-gpu"
    return WarmMiss(reason, f"tuple {release.id} has warm artifacts for {', '.join(others)}; "
                    f"none for {gpu_slug(gpu)}/{layout}")


def check_manifest(store: Store, release: ReleaseTuple, *, gpu: str | None, tp: int, pp: int,
                   trust: WarmTrust) -> Trusted:
    """The tuple's warm artifact for this GPU and layout, if it may be used; else WarmMiss."""
    if not trust.enabled:
        raise WarmMiss("disabled", f"channel {trust.channel}'s policy turns warm starts off")
    if not gpu:
        raise WarmMiss("no-gpu", "no GPU model given and nvidia-smi found none")
    layout = layout_name(tp, pp)
    key = artifact_key(release.id, gpu, layout)
    found = store.read(key)
    if found is None:
        raise _why_absent(store, release, gpu, layout)
    raw = found.data
    try:
        manifest = WarmManifest.model_validate_json(raw)
    except ValidationError as exc:  # refused by name before anything is made on the node
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise WarmMiss("malformed", f"{key}: {where}: {first['msg']}") from None
    if manifest.to_bytes() != raw:
        raise WarmMiss("malformed", f"{key}: not in canonical form")
    b = release.binding
    if manifest.tuple_id != release.id or manifest.image_digest != b.image.digest \
            or manifest.serving_args != list(b.serving.args):
        raise WarmMiss("other-tuple", f"{key} was captured for tuple {manifest.tuple_id} "
                       f"(image {manifest.image_digest[:19]}...), not {release.id}")
    if gpu_slug(manifest.gpu) != gpu_slug(gpu):
        raise WarmMiss("foreign-gpu", f"{key} was captured on {manifest.gpu}, this node has "
                       f"{gpu}")
    if manifest.layout != layout:
        raise WarmMiss("other-layout", f"{key} was captured for {manifest.layout}, the tuple "
                       f"serves {layout}")
    signature = store.read(signature_key(key))
    sig = signature.data if signature is not None else None
    signed_by = None
    if sig is None and trust.require_signature:
        raise WarmMiss("unsigned", f"{key} is not signed and channel {trust.channel} requires "
                       "signatures")
    if sig is not None and trust.require_signature and not trust.trusted:
        raise WarmMiss("bad-signature", f"{signature_key(key)}: the signing policy trusts no "
                       f"key for channel {trust.channel}")
    if sig is not None and trust.trusted:
        try:
            signed_by = verify_statement(
                sig, trust.trusted, name=key, sha256=hashlib.sha256(raw).hexdigest(),
                predicate_type=PREDICATE_TYPE, predicate=predicate(manifest)).key_name
        except BundleError as exc:
            raise WarmMiss("bad-signature", f"{signature_key(key)}: {exc}") from None
    return Trusted(manifest, raw, sig, signed_by)
