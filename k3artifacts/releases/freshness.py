"""``k3a trust refresh``: the store's freshness head re-signed over the heads of every history,
each verified first (a scheduled refresh: the ``refresh-freshness`` deployment, daily). What
the freshness head is and who may sign it: :mod:`k3artifacts.policy.freshness`."""

from __future__ import annotations

from k3artifacts.errors import ConfigError
from k3artifacts.policy.freshness import Freshness, renew, signers
from k3artifacts.policy.record import unchecked_freshness
from k3artifacts.policy.signed import RecordTrust
from k3artifacts.releases.channels import channel_names, read_state
from k3artifacts.releases.record_log import head_mark, logged_tuples
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import Mark
from k3artifacts.trust.keys import RecordSigner, signer_key_id


def refresh(store: RecordStore, signer: RecordSigner) -> Freshness:
    """Verify the root, the policy, every channel and every tuple's record log (from this
    client's remembered heads, whatever the freshness head says: it may have expired), then
    re-sign the freshness head as ``signer``. ConfigError (exit 9) where the policy asks for
    none or ``signer`` may not sign it."""
    policy = unchecked_freshness(store)
    if policy.chain is None or policy.roots is None or policy.chain.mark is None:
        raise ConfigError(f"{store.url} has no policy signed into force, so nothing to refresh",
                          hint="its first move (or `k3a policy init`) seeds one")
    if policy.document.gates.freshness is None:
        raise ConfigError(f"the store's policy ({policy.label()}) asks for no freshness head",
                          hint="propose `freshness: {lifetime_hours: 168}` in its "
                          "promotion-gates.yaml (`k3a policy propose DIR`)")
    if signers(policy.document, policy.roots).get(signer_key_id(signer)) is None:
        raise ConfigError(f"your key {signer_key_id(signer)[:16]} is no root identity of "
                          f"{store.url} and holds no `freshness` role in {policy.label()}",
                          hint="run it as a root identity, or give the refreshing identity "
                          "the role `freshness` (a policy change)")
    marks: dict[str, Mark] = {}
    for name in channel_names(store):
        chain = read_state(store, name, policy=policy).chain
        if chain is not None and chain.mark is not None:
            marks[name] = chain.mark
    trust = RecordTrust.of(policy)
    records = {tuple_id: mark for tuple_id in logged_tuples(store)
               if (mark := head_mark(store, tuple_id, trust=trust)) is not None}
    fresh = renew(store, policy.document, policy.roots, signer,
                  policy_head=policy.chain.mark, channels=marks, records=records)
    if fresh is None:
        raise ConfigError(f"the freshness head of {store.url} kept moving under this refresh",
                          hint="run `k3a trust refresh` again")
    return fresh
