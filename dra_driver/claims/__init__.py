"""The claim engine: prepares and unprepares ResourceClaims for kubelet."""
