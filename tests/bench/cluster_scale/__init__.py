"""The cluster-scale benchmark (issue 49): the real scheduler over many kwok nodes whose
ResourceSlices our slice controller publishes; `python -m tests.bench.cluster_scale --help`."""
