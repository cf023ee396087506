"""python -m tests.cluster up|down|env: see tests/cluster/up.py."""

from tests.cluster.up import main

raise SystemExit(main())
