"""Gate policy in one package: what a tuple must pass to move onto each channel, who may act,
and how the policy itself changes.

* :mod:`.gates`: the gate registry (names, which may be overridden) and the one override rule;
* :mod:`.model`: the policy model and its validation (``promotion-gates.yaml``);
* :mod:`.results`: what a judgement produces (gate results, overrides, the report);
* :mod:`.document`: the policy files as one canonical, digested document;
* :mod:`.record`: the store's policy: versions by digest, the pointer in force, its changes;
* :mod:`.approvals`: approval requests and the records that answer them, with identities.

The gates' checks are in :mod:`k3artifacts.promotion.gates`, one module per gate.
"""
