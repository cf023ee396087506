"""Packing: a model of the scheduler's device allocator, request traces, and the device order."""
