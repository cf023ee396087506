"""Hardware facts -> DRA devices, as pure functions (no I/O, no Kubernetes client)."""
