"""Trust: every record bound to the identity that made it, checked against keys the store
cannot choose.

* :mod:`.keys`: the keys that sign (a personal PEM key made on first use, AWS KMS, PKCS#11)
  and the public halves that check;
* :mod:`.identities`: who may sign what (identities, their keys, their roles), as the store's
  policy names them;
* :mod:`.envelope`: one signed record: the body and a DSSE envelope over a small in-toto
  statement naming its store key and digest; verification with named refusals;
* :mod:`.root`: the root of trust (the identities that sign policy versions, their
  threshold, and the store's id every record names) and its rotation under the old root;
  :mod:`.storeid`: how a store whose root predates ids gets one, and reads what it held;
* :mod:`.pins`: the root each client pins per store, outside the store;
* :mod:`.enrol`: how a client comes to pin a store's root (first use, a team's keys, a
  fingerprint); :mod:`.rotation`: how the root changes, under the old one;
* :mod:`.chain`: a hash-chained, signed history with a head pointer, verified to its start;
* :mod:`.localfiles`, :mod:`.storage`: this client's private files; what is asked of a store.

The design and who may sign what: ``docs/policy-and-identity.md``.
"""
