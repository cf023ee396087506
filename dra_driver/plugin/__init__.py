"""The kubelet-facing gRPC servers: registration, DRAPlugin v1 and v1beta1. Translation only."""
