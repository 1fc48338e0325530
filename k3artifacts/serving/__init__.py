"""What a cluster runs, from a release tuple alone: serving profiles (vLLM arguments and
hardware as data), image references pinned to a digest, ``k3a tuple create`` (a published
revision, a pinned image and a profile bound into a tuple) and the rendered manifests
(``render/``, one module per target). A render reads nothing but the tuple and its options and
applies nothing to a cluster: the same tuple gives the same YAML on any machine.
"""
