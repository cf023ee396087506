"""Unit tests of device health."""
