"""`hack/gpu-check`: the driver on one real NVIDIA GPU without a cluster (docs/gpu-check.md).

It lives in tests/support because it drives the agent exactly as the contract tests do, through the
stand-in API server, the agent launcher and the claim helpers beside it; a copy under hack/ would
drift from them. The check only reads the GPU and runs workloads on it: it never changes compute
mode, MIG mode, clocks or persistence (tests/unit/support/test_gpu_check_sources.py holds it to
that).
"""
