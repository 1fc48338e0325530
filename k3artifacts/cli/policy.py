"""``k3a policy show | init | propose | apply | history``: the store's policy and its changes
(the moves: ``policy/change.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import emit, get_store, json_option, store_option
from k3artifacts.cli.exits import exits

if TYPE_CHECKING:
    from k3artifacts.policy.actor import Acting
    from k3artifacts.stores.base import Store

policy_dir_arg = click.argument(
    "policies_dir", metavar="DIR", type=click.Path(file_okay=False, exists=True, path_type=Path))


def _me(store: Store) -> Acting:
    from k3artifacts.cli.common import acting_here
    return acting_here(store)


@click.group("policy")
def policy_group() -> None:
    """The store's policy: which gates, duties and signatures each channel requires.

    The copy in the store judges every promotion and rollback (a local directory never does);
    each channel history entry records the digest of the version that judged it, and every
    version is signed into force by the store's root identities (`k3a trust show`). Changing
    it is its own recorded move: `propose DIR`, then `apply REQUEST`; a change that is not
    provably stricter needs the root's threshold of signatures (once the root has two
    identities: another root identity's `k3a approve REQUEST`).
    """


@exits(
    (0, "shown"),
    (4, "a policy record refused"),
    (9, "--out names a directory that is not empty"),
)
@policy_group.command("show")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Also write the policy's files to this new (or empty) "
              "directory: a copy to edit and `k3a policy propose`.")
@store_option
@json_option
def show_cmd(out_dir: Path | None, store_url: str, as_json: bool) -> None:
    """The policy in force: version, digest, and its gate policy text; with `--out DIR`, its
    files written to DIR instead of the text (what to edit, then `k3a policy propose DIR`)."""
    from k3artifacts.errors import ConfigError
    from k3artifacts.policy.change import policy_in_force
    policy = policy_in_force(get_store(store_url))
    if out_dir is not None:
        if out_dir.exists() and any(out_dir.iterdir()):
            raise ConfigError(f"--out {out_dir} is not empty",
                              hint="name a new directory: the copy is the policy, nothing else")
        policy.document.write_dir(out_dir)
    out = {"version": policy.version, "digest": policy.digest,
           "files": sorted(policy.document.files), "policy": policy.document.gates}
    head = f"policy {policy.label()}\nfiles: {', '.join(sorted(policy.document.files))}\n"
    if out_dir is not None:
        emit(as_json, out, lambda: click.echo(
            f"{head}written to: {out_dir}\nnext: edit the files there, then "
            f"`k3a policy propose {out_dir}`"))
        return
    emit(as_json, out, lambda: click.echo(
        f"{head}\n{policy.document.files['promotion-gates.yaml']}"))


@exits(
    (0, "recorded"),
    (6, "the store already has a policy (propose a change instead)"),
    (9, "a malformed policy directory"),
)
@policy_group.command("init")
@click.option("--from", "from_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="A policy directory (default: the packaged defaults).")
@click.option("--why", default=None, help="Why (recorded).")
@store_option
@json_option
def init_cmd(from_dir: Path | None, why: str | None, store_url: str, as_json: bool) -> None:
    """Record the store's first policy (only while it has none). Without it, the first move
    seeds the packaged defaults.
    """
    from k3artifacts.policy.change import init_policy
    from k3artifacts.policy.document import PolicyDocument
    store = get_store(store_url)
    document = PolicyDocument.from_dir(from_dir) if from_dir else None
    policy = init_policy(store, document, by=_me(store), why=why)
    emit(as_json, {"version": policy.version, "digest": policy.digest},
         lambda: click.echo(f"recorded: policy {policy.label()} in {store.url}"))


@exits((0, "proposed"), (9, "a malformed policy directory or no change"))
@policy_group.command("propose")
@policy_dir_arg
@click.option("--why", default=None, help="Why this change (recorded).")
@store_option
@json_option
def propose_cmd(policies_dir: Path, why: str | None, store_url: str, as_json: bool) -> None:
    """Propose DIR's policy files as the store's next policy version: stores the document (by
    digest) and an approval request naming what it loosens. Changes nothing in force.
    """
    from k3artifacts.policy.change import propose
    from k3artifacts.policy.document import PolicyDocument
    store = get_store(store_url)
    request, current = propose(store, PolicyDocument.from_dir(policies_dir), by=_me(store),
                               why=why)

    def human() -> None:
        click.echo(f"proposed: {request.subject()} to replace {current.label()}: {request.id}")
        for need in request.needs:
            click.echo(f"  loosens: {need}")
        if request.needs:
            click.echo(f"next: `k3a policy apply {request.id}` once the root's threshold of "
                       f"its identities signed it (another root identity runs `k3a approve "
                       f"{request.id}`)")
        else:
            click.echo(f"next: `k3a policy apply {request.id}` (it only tightens: one root "
                       "identity signs it)")

    emit(as_json, request, human)


@exits(
    (0, "applied"),
    (4, "the proposed change in the store is not the one the request asks for"),
    (5, "too few root identities signed it"),
    (6, "the policy changed since the proposal"),
    (7, "no such request"),
)
@policy_group.command("apply")
@click.argument("request_id", metavar="REQUEST")
@store_option
@json_option
def apply_cmd(request_id: str, store_url: str, as_json: bool) -> None:
    """Put a proposed policy in force, signed by the store's root identities: the proposer's
    and approvers' signatures, and yours if you are one. A change that is not provably
    stricter than the policy in force needs the root's threshold of them (two once the root
    has two identities); a stricter one needs one.
    """
    from k3artifacts.policy.change import apply
    store = get_store(store_url)
    policy = apply(store, request_id, by=_me(store))
    emit(as_json, {"version": policy.version, "digest": policy.digest},
         lambda: click.echo(f"in force: policy {policy.label()}"))


@exits(
    (0, "shown"),
    (4, "a policy record refused (an edited, removed or forked change, a head never signed into "
        "force)"),
    (9, "no root of trust pinned for the store"),
)
@policy_group.command("history")
@store_option
@json_option
def history_cmd(store_url: str, as_json: bool) -> None:
    """Every version of the store's policy: who seeded or proposed it, the root identities
    that signed it into force, what it loosened.
    """
    from k3artifacts.policy.change import policy_history
    recorded = policy_history(get_store(store_url))

    def human() -> None:
        for r in recorded:
            c = r.change
            approved = f", approved by {c.approved_by.label()}" if c.approved_by else ""
            signed = f", signed by {', '.join(sorted(r.signers))}" if r.signers else ""
            loosened = f"; loosens: {'; '.join(c.loosens)}" if c.loosens else ""
            click.echo(f"v{c.version} {c.digest[:12]} {c.at:%Y-%m-%d %H:%M} {c.action} by "
                       f"{c.by.label()}{approved}{signed}{loosened}")

    emit(as_json, [{**r.change.model_dump(mode="json"), "signed_by": sorted(r.signers)}
                   for r in recorded], human)
