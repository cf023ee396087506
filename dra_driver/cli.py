"""The `dra-driver` command: `node`, `inspect`, `cleanup`, `simulate-fault`, `kubelet-client`,
`demo`, `manifests` and `validate-config`, each in its module under `dra_driver/commands/`."""

import argparse
import sys
from types import ModuleType

from dra_driver import __version__
from dra_driver.commands import cleanup, demo, faults, inspection, kubelet, manifests, node, plan, validate
from dra_driver.config.settings import SettingsError

# Each command's module, by the name it registers. Some modules import their tool to fill in
# their parser's defaults (the demo's imports the demo, the manifests' the manifest renderer):
# a command line that names its command builds that command's parser alone, so `dra-driver
# node` does not carry those tools (26 modules, 0.8 MiB of the agent's memory, issue 31).
COMMANDS: dict[str, ModuleType] = {
    "node": node,
    "inspect": inspection,
    "cleanup": cleanup,
    "simulate-fault": faults,
    "kubelet-client": kubelet,
    "demo": demo,
    "manifests": manifests,
    "validate-config": validate,
    "plan": plan,
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone (a name of COMMANDS)."""
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (COMMANDS[command],) if command is not None else COMMANDS.values():
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    named = arguments[0] if arguments and arguments[0] in COMMANDS else None
    args = build_parser(named).parse_args(arguments)
    try:
        code: int = args.run(args)
    except SettingsError as error:
        print(f"dra-driver {args.command}: {error}", file=sys.stderr)
        return 2
    return code
