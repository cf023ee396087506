"""What operators see of a running agent: structured logs, Prometheus metrics with their error
reasons, and the /metrics /healthz /readyz endpoint."""
