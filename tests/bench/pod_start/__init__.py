"""Pod start latency on the real local cluster (issue 50, part 6)."""
