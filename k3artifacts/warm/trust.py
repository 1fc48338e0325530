"""Whether a warm artifact may be run: the one gate every use goes through.

These caches hold compiled kernels and generated Python that the server imports and runs, so
an artifact is used only when all of these hold, checked in this order:

* the channel's policy allows warm starts (``warm_start`` in the gate policy in force in the
  store, ``k3a policy show``);
* its manifest is in the store at the key of this tuple, GPU and layout, and is a signed
  record (``policy/signed.py``) of an identity the policy in force lets capture warm starts
  (role ``warm``), signed for that key: one written by hand, signed by a key the policy does
  not trust for it, edited or copied from another key is a miss (``untrusted``, or
  ``malformed`` for bytes that are no record), never used;
* it was captured for this tuple (id, image digest and serving args), this GPU model and this
  tensor/pipeline-parallel layout;
* where the channel's release rule (``identities.yaml``) requires signatures (or its
  warm-start policy asks for one), it also carries a release signature (``.sig``, as a
  tuple's) by a key the channel trusts, over exactly this manifest: the channel's rule, on
  top of the capturer's record. A release signature present but failing to verify is never
  ignored;
* later, every file matches the manifest's digests (:mod:`.node`).

Anything else is a :class:`WarmMiss` with a named reason: the server starts cold, the reason
is logged, and the pod never fails because of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import ConfigError, MigrationNeeded, UntrustedRecord
from k3artifacts.policy.record import InForce
from k3artifacts.policy.signed import Family, RecordTrust, parse_signed
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.signing.attestation import verify_statement
from k3artifacts.signing.dsse import BundleError
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import (
    ARTIFACT_PREFIX,
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
    "no-policy", "untrusted",
)
#: The manifest as stored: a signed record of the identity that captured it.
WARM_MANIFESTS = Family(ARTIFACT_PREFIX, "warm-manifest", WarmManifest, "captured_by")
#: Misses that say the standing manifest is no record anyone the policy trusts made: any
#: capture by an identity with the role ``warm`` replaces it (:mod:`.claim`).
NOBODY_MADE = ("malformed", "untrusted")


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

    #: Who may have captured one: the policy's identities holding the role ``warm``.
    records: RecordTrust
    enabled: bool = True
    require_signature: bool = False
    #: Keys whose signatures count (empty: a signature cannot be checked, so none is asked).
    trusted: dict[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    channel: str | None = None


def warm_trust(policy: InForce, channel: str | None) -> WarmTrust:
    """The channel's warm-start rule: who may capture (the policy's identities), its
    ``warm_start`` policy and its release rule. No channel (a bare tuple, a pre-warm of a
    candidate): release signatures are required when any channel requires them, since the
    artifact may end up serving there. Never raises over the release rules: a channel that
    requires signatures and trusts no key gets misses. ``policy``: the store's policy in force
    (``k3a policy show``)."""
    document = policy.document
    gates = document.gates
    rule = gates.channels.get(channel) if channel else None
    warm = rule.warm_start if rule is not None else None
    try:
        keys = document.release_keys()
    except MigrationNeeded:
        # Release keys still trusted the old way: nothing counts until the migration ran,
        # and an unsigned artifact is not used meanwhile.
        keys = None
    if keys is None:
        required, trusted = True, {}
    else:
        if channel is not None:
            required = keys.required(channel)
        else:
            required = any(rule.required
                           for rule in keys.identities.release_channels.values())
        try:
            trusted = keys.for_channel(channel)
        except ConfigError:
            trusted = {}
    if warm is not None and warm.require_signature:
        required = True
    return WarmTrust(records=RecordTrust.of(policy),
                     enabled=warm.enabled if warm is not None else True,
                     require_signature=required, trusted=trusted, channel=channel)


@dataclass(frozen=True)
class Trusted:
    manifest: WarmManifest
    #: The record as stored (the manifest and its capturer's signature).
    raw: bytes
    #: The release signature (``.sig``), where there is one.
    signature: bytes | None
    #: The release key that made it, where the channel's release rule checked one.
    signed_by: str | None

    @property
    def digest(self) -> str:
        """The manifest's digest: what its record's statement and its release signature name."""
        return self.manifest.digest()


def _record_miss(error: UntrustedRecord) -> WarmMiss:
    reason = "malformed" if error.reason in ("unreadable", "malformed") else "untrusted"
    return WarmMiss(reason, str(error))


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
    try:  # refused by name before anything is made on the node
        manifest = parse_signed(raw, key=key, family=WARM_MANIFESTS, trust=trust.records)
    except UntrustedRecord as exc:
        raise _record_miss(exc) from None
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
    # Without a channel (a candidate pre-warmed) the rule is every channel's at once.
    whose = (f"channel {trust.channel}" if trust.channel is not None
             else "a channel of the policy (none named: the strictest applies)")
    if sig is None and trust.require_signature:
        raise WarmMiss("unsigned", f"{key} has no release signature and {whose} requires "
                       "one (capture with --signing-key KEY, a key the policy trusts)")
    if sig is not None and trust.require_signature and not trust.trusted:
        raise WarmMiss("bad-signature", f"{signature_key(key)}: the policy names no release "
                       f"identity for {whose}")
    if sig is not None and trust.trusted:
        try:
            signed_by = verify_statement(
                sig, trust.trusted, name=key, sha256=manifest.digest(),
                predicate_type=PREDICATE_TYPE, predicate=predicate(manifest)).key_name
        except BundleError as exc:
            raise WarmMiss("bad-signature", f"{signature_key(key)}: {exc}") from None
    return Trusted(manifest, raw, sig, signed_by)
