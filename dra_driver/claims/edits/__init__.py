"""What a prepared device changes in its container: the CDI spec and its file, and the edits per
device kind (whole GPUs and MIG, MIG capability nodes, vGPU limits with HAMi-core, the node-wide
driver files). Imported by the protocol, sharing/ and status/; it imports only the claim reading
of claims/ (the opaque config, the vGPU grant), never the protocol."""
