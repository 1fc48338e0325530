"""Warm start: the compile and autotune caches of a release tuple, captured once, verified,
and brought to a node with the weights (docs/guides/warm-start.md).

One module per job: :mod:`.model` (the manifest, its keys, GPU names and layouts),
:mod:`.capture` (cache directories -> content-addressed blobs + a create-once manifest),
:mod:`.trust` (is this artifact ours to run: digest, tuple, GPU, layout, signature),
:mod:`.node` (into the node cache and, at use, into the server's cache directories),
:mod:`.retention` (a warm artifact lives exactly as long as its tuple's weights).
"""
