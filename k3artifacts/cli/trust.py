"""``k3a key create | show`` and ``k3a trust init | show | rotate | migrate | refresh``: the key
this account signs with, the root of trust this client pins for a store, and the store's
freshness (docs/policy-and-identity.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli.common import emit, get_store, json_option, store_option
from k3artifacts.cli.exits import exits

if TYPE_CHECKING:
    from k3artifacts.trust.identities import KeyEntry
    from k3artifacts.trust.keys import RecordSigner
    from k3artifacts.trust.pins import Pin
    from k3artifacts.trust.root import Root


def _key_view(signer: RecordSigner) -> dict[str, Any]:
    from k3artifacts.trust.identities import KeyEntry
    from k3artifacts.trust.keys import key_kind, signer_key_id

    entry = KeyEntry.for_signer(signer)
    return {"source": signer.source, "key_id": signer_key_id(signer),
            "kind": key_kind(signer.public_key), "public_key": entry.pem,
            "entry": entry.model_dump(exclude_none=True)}


def _print_key(view: dict[str, Any]) -> None:
    import yaml

    click.echo(f"key: {view['source']}\nkind: {view['kind']}\nkey id: {view['key_id']}\n")
    click.echo(view["public_key"], nl=False)
    click.echo("\nAs an identity in a policy's identities.yaml (a change the store's root "
               "identities approve):\n")
    click.echo(yaml.safe_dump({"keys": [view["entry"]]}, sort_keys=False))


@click.group("key")
def key_group() -> None:
    """The key this account signs its records with: reviews, approvals, evidence, moves.

    \b
    Unless K3A_IDENTITY_KEY names another (a PEM file, kms:KEY, a pkcs11: URI), it is your
    personal key, $XDG_CONFIG_HOME/k3artifacts/keys/personal.pem (~/.config/...), made on
    first use: the first command that signs makes it and says where, as ssh-keygen would.
    Give its public half (personal.pub.pem) to the store's root identities: the store's
    policy lists it, with the roles you may sign for.
    """


@exits((0, "made"), (6, "you already have one (`k3a key show`)"))
@key_group.command("create")
@click.option("--kind", type=click.Choice(["ed25519", "ecdsa-p256", "ecdsa-p384"]),
              default="ed25519", show_default=True, help="Key algorithm.")
@json_option
def key_create_cmd(kind: str, as_json: bool) -> None:
    """Make your personal key (private 0600, in a 0700 directory) and its public half."""
    from k3artifacts.errors import Conflict
    from k3artifacts.trust.keys import PERSONAL_PUBLIC, create_personal_key, personal_key_path

    try:
        signer = create_personal_key(kind)  # type: ignore[arg-type]
    except FileExistsError:
        raise Conflict(f"you already have a personal key: {personal_key_path()}",
                       hint="`k3a key show` prints it; remove it yourself only if it is lost "
                       "to you (the policy must then list your new key)") from None
    view = {**_key_view(signer), "public_path": str(personal_key_path().with_name(
        PERSONAL_PUBLIC))}

    def human() -> None:
        click.echo(f"Generated a {view['kind']} key.\n"
                   f"Your identity key has been saved in {view['source']}\n"
                   f"Your public key has been saved in {view['public_path']}\n"
                   f"The key id is {view['key_id']}")

    emit(as_json, view, human)


@exits(
    (0, "shown"),
    (2, "an unknown role or a bad identity name"),
    (7, "no personal key yet (`k3a key create`)"),
    (9, "a key refused (readable by others, not ed25519 or ECDSA P-256/P-384, a KMS key of "
        "another kind)"),
)
@key_group.command("show")
@click.option("--pem", "pem_only", is_flag=True,
              help="Print only the public key (PEM): the file a root identity passes to "
              "`k3a trust rotate --add NAME=FILE`.")
@click.option("--entry", "entry_name", default=None, metavar="NAME",
              help="Print only this key as identity NAME of a policy's identities.yaml, "
              "indented to go under its `identities:` (append it to a copy of the policy, "
              "then `k3a policy propose`).")
@click.option("--roles", default="", metavar="ROLE,...",
              help="With --entry: the roles the identity is to hold (review, approve, evaluate, "
              "scan, preflight, traffic, promote, policy, warm, freshness, release: an "
              "ECDSA key's, to sign releases).")
@json_option
def key_show_cmd(pem_only: bool, entry_name: str | None, roles: str, as_json: bool) -> None:
    """Which key this process signs with, its key id and public key, and how a policy names it."""
    from k3artifacts.trust.keys import identity_signer

    view = _key_view(identity_signer(create=False).signer)
    if entry_name is not None:
        text = _identity_entry(entry_name, roles, view["entry"])
        emit(as_json, {"entry": text}, lambda: click.echo(text, nl=False))
    elif pem_only:
        emit(as_json, {"public_key": view["public_key"]},
             lambda: click.echo(view["public_key"], nl=False))
    else:
        emit(as_json, view, lambda: _print_key(view))


def _identity_entry(name: str, roles: str, key: dict[str, Any]) -> str:
    """``key`` as identity ``name``'s entry of an identities.yaml, holding ``roles``."""
    from pydantic import ValidationError

    from k3artifacts.errors import UsageError
    from k3artifacts.trust.identities import Identity, check_names, entry_yaml

    try:
        check_names([name])
        identity = Identity(roles=[r.strip() for r in roles.split(",") if r.strip()],
                            keys=[key])
    except (ValueError, ValidationError) as exc:
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise UsageError(f"not an identity entry: {detail}",
                         hint="roles: review, approve, evaluate, scan, preflight, traffic, "
                         "promote, policy, warm, freshness, release; names: letters, digits and "
                         "._@:/+=-") from None
    return entry_yaml(name, identity)


def _root_view(root: Root) -> dict[str, Any]:
    return {"version": root.version, "fingerprint": root.fingerprint,
            "store_id": root.store_id, "threshold": root.threshold, "previous": root.previous,
            "identities": {name: [k.id for k in keys] for name, keys in root.identities.items()}}


def _pin_view(pin: Pin, changed: bool) -> dict[str, Any]:
    from k3artifacts.trust.pins import config_map_files, pin_path

    return {"store": pin.store, "pin": str(pin_path(pin.store)), "how": pin.how,
            "pinned_at": pin.pinned_at, "changed": changed, "root": _root_view(pin.root),
            "config_map": config_map_files(pin)}


def _print_pin(view: dict[str, Any], verb: str) -> None:
    root = view["root"]
    click.echo(f"{verb}: root v{root['version']} of {view['store']}\n"
               f"fingerprint: {root['fingerprint']}\n"
               f"store id: {root['store_id'] or 'none (a root older than store ids)'}\n"
               f"threshold: {root['threshold']} of {len(root['identities'])} identities\n"
               f"pinned in: {view['pin']} ({view['how']})")
    for name, ids in root["identities"].items():
        click.echo(f"  {name}: {', '.join(ids)}")
    if len(root["identities"]) == 1:
        click.echo("note: one root identity: every policy change needs only it. Add a second "
                   "(`k3a trust rotate --add NAME=KEY.pub.pem`) to need two for any change "
                   "that is not provably stricter.")


def _named_keys(specs: tuple[str, ...]) -> dict[str, list[KeyEntry]]:
    """``NAME=KEYFILE`` (or ``KEYFILE``, named after the file) -> identity keys."""
    from k3artifacts.errors import UsageError
    from k3artifacts.trust.identities import KeyEntry
    from k3artifacts.trust.keys import read_public_key

    named: dict[str, list[KeyEntry]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, Path(spec).name.split(".")[0]
        if name in named:
            raise UsageError(f"identity {name!r} is given twice",
                             hint="name each key: --root NAME=KEYFILE")
        named[name] = [KeyEntry.of(read_public_key(Path(path)))]
    return named


@click.group("trust")
def trust_group() -> None:
    """The root of trust this client pins for a store: the identities whose signatures make a
    policy version the store's, and how many a change needs.

    \b
    It lives outside the store ($XDG_CONFIG_HOME/k3artifacts/trust/), once per machine or
    image; the store cannot change it. A change that is not provably stricter needs two root
    identities; the root itself changes only by a rotation signed under the old one.
    First use: the client that seeds a store's first policy pins its own key as the root.
    Everyone else pins it before acting: `init --fingerprint FP` (compare FP with a root
    identity's `k3a trust show`), or a team pins its keys before first use:
    `init --root alice=alice.pub.pem --root bob=bob.pub.pem`.
    """


@exits(
    (0, "pinned (or already)"),
    (2, "a bad threshold or key list"),
    (4, "the store's root is another or a rotation does not verify"),
    (7, "no such store or no root in it"),
    (9, "this client pins another root for the store, or a key or pin file refused"),
)
@trust_group.command("init")
@click.option("--root", "roots", multiple=True, metavar="[NAME=]KEYFILE",
              help="A root identity's public key (PEM; repeat for each). NAME defaults to the "
              "file's name up to its first dot.")
@click.option("--threshold", type=click.IntRange(min=1), default=None,
              help="Root identities a change that is not provably stricter needs "
              "[default: 2, or 1 for a single identity].")
@click.option("--store-id", default=None, metavar="ID",
              help="With --root: the store id the team's first pin drew (`k3a trust show` "
              "prints it), so every member pins the same root [default: a new one].")
@click.option("--fingerprint", default=None, metavar="FP",
              help="Pin the root the store already has, if its fingerprint is FP (given to you "
              "out of band by someone who pinned it).")
@click.option("--name", default=None,
              help="Your identity's name when you become the store's root (no --root, no "
              "--fingerprint) [default: your account name].")
@store_option
@json_option
def trust_init_cmd(roots: tuple[str, ...], threshold: int | None, store_id: str | None,
                   fingerprint: str | None, name: str | None, store_url: str,
                   as_json: bool) -> None:
    """Pin the store's root of trust in this client's configuration.

    \b
    With --root: those keys are the root (a team, before or after first use; the root is
    published in the store when your key is one of them and the store has none), with a
    new store id, or the one a teammate's pin drew (--store-id).
    With --fingerprint: the root the store holds, if it has that fingerprint.
    With neither: your own key becomes the root of a store that has none (first use).
    Rotations the store holds after the pinned root are verified and followed.
    """
    from k3artifacts.errors import NotFound, UsageError
    from k3artifacts.trust import enrol
    from k3artifacts.trust.keys import identity_signer
    from k3artifacts.trust.root import first_root

    if roots and fingerprint:
        raise UsageError("--root and --fingerprint pin two different ways: give one")
    if threshold is not None and not roots:
        raise UsageError("--threshold goes with --root (a pinned or first root keeps its own)")
    if store_id is not None and not roots:
        raise UsageError("--store-id goes with --root (a pinned or first root names its own)")
    # A team may pin its keys before the store exists; nothing is written to it then.
    store = get_store(store_url, must_exist=not roots)
    if fingerprint:
        pin, changed = enrol.join(store, fingerprint)
    elif roots:
        root = first_root(_named_keys(roots), threshold, store_id)
        signer = None
        if store.exists():
            try:
                signer = identity_signer(create=False).signer
            except NotFound:
                pass  # no key of ours: we cannot be one of the root's identities
        pin, changed = enrol.pin_keys(store, root, signer)
    else:
        from k3artifacts.policy.actor import os_account

        key = identity_signer(create=True)
        if key.created:
            click.echo(f"made your personal key: {key.signer.source} (public half beside it)",
                       err=True)
        pin, changed = enrol.first_use(store, key.signer, name or os_account())
    view = _pin_view(pin, changed)
    emit(as_json, view, lambda: _print_pin(view, "pinned" if changed else "already pinned"))


@exits(
    (0, "shown"),
    (4, "a rotation in the store does not verify or the store's root is another"),
    (9, "no root pinned for the store, or the pin file refused"),
)
@trust_group.command("show")
@store_option
@json_option
def trust_show_cmd(store_url: str, as_json: bool) -> None:
    """The root this client pins for the store: version, fingerprint, threshold, identities.
    Rotations the store holds after it are verified and followed first; --json adds the pin
    as ConfigMap data for a verifier (mounted at $XDG_CONFIG_HOME/k3artifacts/trust).
    """
    from k3artifacts.trust.pins import follow, require_pin

    store = get_store(store_url, must_exist=False)
    pin, changed = follow(store, require_pin(store.url))
    view = _pin_view(pin, changed)
    emit(as_json, view, lambda: _print_pin(view, "followed to" if changed else "pinned"))


@exits(
    (0, "published or proposed"),
    (2, "nothing to change or a bad threshold"),
    (4, "the proposal is not the one FP names, or does not verify"),
    (6, "another rotation was published first"),
    (7, "no proposal to cosign"),
    (9, "your key is not a root identity or no root is pinned"),
)
@trust_group.command("rotate")
@click.option("--add", "added", multiple=True, metavar="[NAME=]KEYFILE",
              help="Make this public key a root identity (a NAME already there gets this key "
              "instead of its own).")
@click.option("--remove", "removed", multiple=True, metavar="NAME",
              help="Stop trusting this root identity.")
@click.option("--threshold", type=click.IntRange(min=1), default=None,
              help="The new root's threshold [default: kept; 2 once there are two].")
@click.option("--cosign", default=None, metavar="FP",
              help="Add your signature to the proposed rotation whose fingerprint is FP "
              "(printed by whoever proposed it).")
@store_option
@json_option
def trust_rotate_cmd(added: tuple[str, ...], removed: tuple[str, ...], threshold: int | None,
                     cosign: str | None, store_url: str, as_json: bool) -> None:
    """Change the store's root: signed by you under the root in force, published (and pinned)
    once its threshold of root identities signed; until then it waits in the store as a
    proposal, and another root identity adds their signature with --cosign FP. A root older
    than store ids gets one (with no other change, too): the records the store holds are
    vouched for first, and every record signed after names it.
    """
    from k3artifacts.errors import UsageError
    from k3artifacts.trust import rotation
    from k3artifacts.trust.keys import identity_signer
    from k3artifacts.trust.pins import follow, require_pin

    if cosign and (added or removed or threshold):
        raise UsageError("--cosign signs a proposal as it is: it takes no changes")
    store = get_store(store_url)
    pin, _ = follow(store, require_pin(store.url))
    # A root older than store ids changes by getting one, if by nothing else.
    if not cosign and not (added or removed or threshold) and pin.root.store_id is not None:
        raise UsageError("nothing to change", hint="--add NAME=KEYFILE, --remove NAME, "
                         "--threshold N, or --cosign FP")
    signer = identity_signer(create=False).signer
    if cosign:
        done = rotation.cosign(store, pin, signer, cosign)
    else:
        done = rotation.rotate(store, pin, signer, add=_named_keys(added), remove=list(removed),
                               threshold=threshold)
    view = {"store": store.url, "root": _root_view(done.root), "signed_by": sorted(done.signers),
            "needs": done.needs, "published": done.published, "key": done.key}
    fp, by = done.root.fingerprint, ", ".join(sorted(done.signers))

    def human() -> None:
        if done.published:
            click.echo(f"published: root v{done.root.version} ({fp}), signed by {by}; this "
                       "client pins it now")
        else:
            click.echo(f"proposed: root v{done.root.version} ({fp}), signed by {by}; "
                       f"{done.needs} root identities must sign\nnext: another root identity "
                       f"runs `k3a trust rotate --cosign {fp}`")

    emit(as_json, view, human)


@exits(
    (0, "migrated (or nothing to do, or shown)"),
    (4, "a history that does not hold together as found (a pointer set back or edited, an entry "
        "removed): never re-signed"),
    (9, "your key is not one of the store's root identities, or the store has a root this client "
        "does not pin"),
)
@trust_group.command("migrate")
@click.option("--dry-run", is_flag=True, help="Say what it would re-sign and sign; write "
              "nothing.")
@store_option
@json_option
def trust_migrate_cmd(dry_run: bool, store_url: str, as_json: bool) -> None:
    """Re-sign a store's records written before records were signed, as one of its root
    identities (you vouch for them as found): each record family in turn (the policy, then the
    channels' histories), each history's entries signed by you into its base, which its pointer
    then holds (no record written once is replaced); the policy's next version is signed into
    force, naming the root's identities where it names none.

    \b
    A store with no root of trust at all gets one from your key first (as its first move
    would), and only when there is something to migrate. Until it is migrated, such a store is
    read as found (where its policy says so) and nothing moves on it. Run again, it finds
    nothing to do.
    """
    from k3artifacts.migration.run import act_migration, plan_migration

    store = get_store(store_url)
    plan = plan_migration(store)
    if plan.made_key is not None:
        click.echo(f"made your personal key: {plan.made_key} (public half beside it)",
                   err=True)
    if not dry_run:
        act_migration(store, plan)
    view = {"store": store.url, "identity": plan.identity, "dry_run": dry_run,
            "first_use": plan.first_root is not None and not plan.empty,
            "families": {f.family: list(f.steps) for f in plan.families}}

    def human() -> None:
        if plan.empty:
            click.echo(f"nothing to migrate in {store.url}")
            return
        verb = "would" if dry_run else "did"
        if plan.first_root is not None:
            click.echo(f"root: {verb} make your key ({plan.identity}) the store's root v1 "
                       f"({plan.first_root.fingerprint}), pinned here")
        for family in plan.families:
            for step in family.steps:
                click.echo(f"{family.family}: {step}")

    emit(as_json, view, human)



@exits(
    (0, "re-signed"),
    (4, "a history of the store refused (set back behind what this client verified, edited, "
        "forked): never vouched for"),
    (9, "your key is no root identity and holds no `freshness` role, or the store's policy asks "
        "for no freshness head"),
)
@trust_group.command("refresh")
@store_option
@json_option
def trust_refresh_cmd(store_url: str, as_json: bool) -> None:
    """Re-sign the store's freshness head: the root, the policy, every channel and every
    tuple's record log verified first, their heads named, valid for the lifetime the store's
    policy sets (`freshness: lifetime_hours`). Readers refuse the store once it expires; every
    move re-signs it too, and the `refresh-freshness` deployment runs this daily.
    """
    from k3artifacts.releases.freshness import refresh
    from k3artifacts.trust.keys import identity_signer

    store = get_store(store_url)
    fresh = refresh(store, identity_signer(create=False).signer)
    view = {"store": store.url, **fresh.model_dump(mode="json")}

    def human() -> None:
        click.echo(f"refreshed: {store.url} until {fresh.expires:%Y-%m-%d %H:%M} UTC (policy "
                   f"#{fresh.policy.seq}, root v{fresh.root_version}, "
                   f"{len(fresh.channels)} channel(s), {len(fresh.records)} record log(s))")

    emit(as_json, view, human)
