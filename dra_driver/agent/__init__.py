"""The node agent's parts: what it runs on (real or simulated GPUs), its Kubernetes client, and
the owner of what its slices say. `agent/node.py` wires them, and everything else, together."""
