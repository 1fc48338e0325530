"""What a revision is, and hashing it at the machine's limit: the pinned reference
``org/name@<commit>`` (parsed only here), the shard manifest whose canonical digest names a
revision's weights, and the hashers (one streaming pass computes every digest a file needs; many
files are hashed one per core, each byte read once). It opens no store and talks to no peer: it
is the vocabulary every package above it shares.
"""
