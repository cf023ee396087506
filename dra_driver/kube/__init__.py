"""The Kubernetes edge: every conversation with the API server (the lean client, one JSON call
and one watch stream, one error type, one list-and-watch loop, a façade per resource, the
timeouts), kubeconfig loading, and the API's own rules for names."""
