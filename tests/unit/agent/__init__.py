"""Unit tests of the node agent's parts."""
