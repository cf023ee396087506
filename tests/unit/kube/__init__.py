"""Unit tests of the Kubernetes client."""
