"""The `dra-driver` command: `node`, `inspect`, `cleanup`, `simulate-fault`, `kubelet-client`,
`demo`, `manifests` and `validate-config`, each in its module under `dra_driver/commands/`."""

import argparse
import importlib
import sys
from types import ModuleType

from dra_driver import __version__
from dra_driver.base.errors import DriverError, exit_code
from dra_driver.commands.imports import imports_frozen

# Each command's module under dra_driver.commands, by the name it registers. Some modules import
# their tool to fill in their parser's defaults (the demo's imports the demo, the manifests' the
# manifest renderer): a command line that names its command builds that command's parser alone,
# so `dra-driver node` does not carry those tools (26 modules, 0.8 MiB of the agent's memory,
# issue 31). The modules are imported when their parser is built, inside `main`'s
# imports_frozen, without full collections.
COMMANDS: dict[str, str] = {
    "node": "node",
    "inspect": "inspection",
    "cleanup": "cleanup",
    "simulate-fault": "faults",
    "kubelet-client": "kubelet",
    "demo": "demo",
    "manifests": "manifests",
    "validate-config": "validate",
    "plan": "plan",
}


def command_module(command: str) -> ModuleType:
    return importlib.import_module(f"dra_driver.commands.{COMMANDS[command]}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone (a name of COMMANDS)."""
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in (command,) if command is not None else COMMANDS:
        command_module(name).add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    named = arguments[0] if arguments and arguments[0] in COMMANDS else None
    with imports_frozen():  # the command's modules, settings and options included
        parser = build_parser(named)
        args = parser.parse_args(_dashed_values_joined(parser, arguments))
    try:
        code: int = args.run(args)
    except DriverError as error:
        print(f"dra-driver {args.command}: {error}", file=sys.stderr)
        return exit_code(error)
    return code


def _dashed_values_joined(parser: argparse.ArgumentParser, arguments: list[str]) -> list[str]:
    """argparse takes a value that starts with '-' (`--pods -3xgpu`) for an unknown option and
    stops with its usage; joined to its flag (`--pods=-3xgpu`) it reaches the option's own
    check, which names what is wrong with it. Only the flags of the command's options that take
    one value are joined, and only to a word that is none of the command's flags."""
    commands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not arguments or not commands or arguments[0] not in commands[0].choices:
        return arguments
    actions = commands[0].choices[arguments[0]]._actions
    flags = {flag for action in actions for flag in action.option_strings}
    valued = {
        flag
        for action in actions
        if action.nargs is None and action.const is None
        for flag in action.option_strings
    }
    joined: list[str] = []
    words = iter(arguments)
    for word in words:
        if word in valued and (value := next(words, None)) is not None:
            if value.startswith("-") and value not in flags:
                joined.append(f"{word}={value}")
            else:
                joined += [word, value]
        else:
            joined.append(word)
    return joined
