"""Unit tests of the kubelet-facing gRPC servers and their protos."""
