"""The node agent's parts: what it runs on (real or simulated GPUs), its Kubernetes client, and
the owner of what its slices say. `dra_driver.node` wires them together."""
