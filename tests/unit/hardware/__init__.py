"""Unit tests of the hardware layer."""
