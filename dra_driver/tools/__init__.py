"""Operator and developer tools around the agent, not run by it: inspection, a kubelet stand-in
client, the podman demo and the rendered deployment manifests."""
