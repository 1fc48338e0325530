"""Moving a store, and the settings that name its keys, from an older model to the current
one. ``k3a trust migrate``: records written before records were signed, signed by a root
identity of the store, one record family at a time (:mod:`.registry`, :mod:`.run`; what a
family's migrator is: :mod:`k3artifacts.policy.migrating`): the policy's and the channels'
histories signed as found into each history's base (:mod:`.policy`, :mod:`.channels`,
:mod:`.histories`), after which no verifier reads anything unsigned; and the release keys a
policy still trusts by ``signing/trusted-keys.yaml`` made identities holding the release role
(:mod:`.release_keys`). The variables and the file of the time release keys were a model of
their own are read here only, until their removal (:mod:`.signing_variables`,
:mod:`.release_keys`)."""
