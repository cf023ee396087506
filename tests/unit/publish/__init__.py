"""Unit tests of ResourceSlice publishing."""
