"""Unit tests of durable node state."""
