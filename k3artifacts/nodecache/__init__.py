"""The node-local weight cache: ``k3a pull`` puts a tuple's weights on a node's NVMe, verified
as the bytes arrive, resumable by part, shared between revisions by sha256, leased by running
servers and evicted least recently used first. Nothing on the node's disk is evidence: whatever a
pull keeps, links or calls "already here" it hashed in that run (where the server's verified
load hashes the weights as it reads them, ``--verified-by-loader``, the pull leaves the weights
already there to it and fetches again the files it refused), and nothing under the cache root
is opened but through ``safefs`` (a planted link is refused, never followed).
"""
