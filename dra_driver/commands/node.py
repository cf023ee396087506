"""`dra-driver node`: the node agent (kubelet plugin)."""

import argparse
import sys

from dra_driver.commands.event_loop import run_coroutine
from dra_driver.commands.imports import imports_frozen
from dra_driver.config.option_table import AGENT_OPTIONS, add_agent_switches, add_options
from dra_driver.config.settings import node_settings


def run(args: argparse.Namespace) -> int:
    with imports_frozen():  # the agent's modules: most of its time to serving
        from dra_driver.agent.node_process import run_node  # noqa: PLC0415
        from dra_driver.observability.logs import configure_logging  # noqa: PLC0415 - keep `--help` fast

    settings = node_settings(args, stderr_is_terminal=sys.stderr.isatty())
    configure_logging(settings.log_format, settings.verbosity)
    run_coroutine(run_node(settings))  # a failure to start: its one line and exit code (cli.main)
    return 0


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    node = commands.add_parser("node", help="run the node agent (kubelet plugin)")
    add_options(node, AGENT_OPTIONS)
    add_agent_switches(node)
    node.set_defaults(run=run)
