"""Unit tests of options and operator files."""
