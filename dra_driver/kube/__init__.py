"""Talking to the Kubernetes API server (the keep-alive REST client, kubeconfig loading) and the
API's own rules for names and status answers."""
