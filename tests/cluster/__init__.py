"""A real single-node Kubernetes from upstream modules, run as processes on this machine: the
components built from hack/cluster/modules, the node's images written locally, the cluster
brought up and torn down (docs/e2e.md)."""
