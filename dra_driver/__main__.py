"""Allows `python -m dra_driver`, which is how tests start the agent without relying on PATH."""

from dra_driver.cli import main

raise SystemExit(main())
