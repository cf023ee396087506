"""What a workload and the cluster learn of a claim after prepare: the ResourceClaim's
status.devices and its background writer, and the per-device metadata files in the container.
Imported only by the protocol (the engine, recovery, prepared); it imports the claim reading and
records of claims/ and edits/."""
