"""The command line builds only the parser of the command it names (cli.COMMANDS)."""

import subprocess
import sys

from dra_driver.cli import COMMANDS, build_parser

# What `dra-driver node` must not carry: the tools other commands' parsers import for defaults.
OTHER_TOOLS = ("dra_driver.tools.demo", "dra_driver.tools.manifests")


def _registered(command: str | None) -> list[str]:
    parser = build_parser(command)
    (subcommands,) = [action for action in parser._actions if action.dest == "command"]
    assert subcommands.choices is not None
    return list(subcommands.choices)


def test_each_command_module_registers_the_name_it_is_listed_under() -> None:
    for name in COMMANDS:
        assert _registered(name) == [name]
    assert _registered(None) == list(COMMANDS)


def test_the_node_command_line_imports_no_other_commands_tools() -> None:
    probe = (
        "import sys\n"
        "from dra_driver.cli import main\n"
        "try:\n"
        "    main(['node', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print([name for name in {OTHER_TOOLS!r} if name in sys.modules])\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert answer.stdout.strip().splitlines()[-1] == "[]"
