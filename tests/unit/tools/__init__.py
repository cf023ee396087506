"""Unit tests of the operator tools."""
