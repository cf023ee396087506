"""Unit tests of the test support code itself (the stand-in API server)."""
