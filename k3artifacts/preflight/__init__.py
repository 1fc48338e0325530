"""The infrastructure preflight (``k3a preflight``): named checks of the cluster a tuple is
about to run on, each with the evidence it read: capacity, storage throughput, IAM, private
networking, node health. The ``infrastructure`` gate reads the recorded result."""
