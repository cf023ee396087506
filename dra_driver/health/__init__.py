"""Device health: XID events and lost GPUs become taints on the published devices and the
kubelet health stream."""
