"""Signatures over what staging recorded: a revision's (the OpenSSF model-signing format over
every file's sha256 and the manifest's) and a tuple's (an in-toto statement over its record and
binding), in sigstore bundles made and checked with ``cryptography``, against the trusted keys
and the channels that require them (the store's policy, ``signing/``). A signature is made from
recorded digests, never by reading the weights again, and checked before any weight byte is;
nothing here reaches the network.
"""
