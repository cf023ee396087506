"""The `dra-driver` command: `node`, `inspect`, `cleanup`, `simulate-fault`, `kubelet-client`,
`demo`, `manifests` and `validate-config`, each in its module under `dra_driver/commands/`."""

import argparse
import sys

from dra_driver import __version__
from dra_driver.commands import cleanup, demo, faults, inspection, kubelet, manifests, node, plan, validate
from dra_driver.config.settings import SettingsError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (node, inspection, cleanup, faults, kubelet, demo, manifests, validate):
        command.add_parser(commands)
    plan.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except SettingsError as error:
        print(f"dra-driver {args.command}: {error}", file=sys.stderr)
        return 2
    return code
