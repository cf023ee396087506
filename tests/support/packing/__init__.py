"""The packing benchmark's model (claim traces, their replay, a repacking bound): used by
tests/bench and its tests only, so it stays out of the wheel."""
