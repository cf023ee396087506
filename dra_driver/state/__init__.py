"""Durable state on the node: crash-safe file writes, batched fsyncs, the locks that serialise
claims, the boot id that tells a reboot from a restart, and the failpoints that test crashes."""
