"""The ways a GPU can be offered (the node config's modes): one module each, listed by registry.py."""
