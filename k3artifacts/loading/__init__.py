"""The verified load (`--load-format k3a`): vLLM's weights read once from the node's copy, each
file hashed with xxh3-128 in the same pass against the manifest signed for the tuple the server
was started for, no tensor handed over before its file matched, and the load refused on every
rank when any file did not. `plan` checks the signatures and the small files, `stream` reads
and hashes, `share` decides which rank of a node hashes which file and compares what the ranks
read, `witness` records each file's identity over a rank's read (so a rank reading a file
another rank hashed proves it read the same one), `vllm_plugin` is vLLM's entry point (the
only module that imports vLLM, and only when vLLM calls it).
"""
