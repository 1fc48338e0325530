"""``k3a trust migrate``: records written before records were signed, vouched for and signed by
a root identity of the store, one record family at a time (:mod:`.registry`, :mod:`.run`;
what a family's migrator is: :mod:`k3artifacts.policy.migrating`): the policy's and the
channels' histories signed as found into each history's base (:mod:`.policy`,
:mod:`.channels`, :mod:`.histories`), after which no verifier reads anything unsigned."""
