"""The node-local weight cache: ``k3a pull`` puts a tuple's weights on a node's NVMe, verified."""
