"""Unit tests of logs and metrics."""
