"""`dra-driver simulate-fault`: make a running agent's simulated GPU fail, for trying out health."""

import argparse
import sys
from pathlib import Path

from dra_driver.config.settings import SettingsError


def run(args: argparse.Namespace) -> int:
    from dra_driver.health.simulated_faults import SimulatedFault, submit_fault  # noqa: PLC0415

    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():
        raise SettingsError(f"--state-dir: {state_dir} is not a directory")
    fault = SimulatedFault(gpu=args.gpu, kind="lost" if args.lost else "xid", xid=args.xid or 0)
    try:
        path = submit_fault(state_dir, fault)  # a FaultError names the flag: exit 2 (cli.main)
    except OSError as error:
        print(f"dra-driver simulate-fault: cannot queue the fault: {error}", file=sys.stderr)
        return 1
    print(f"fault queued for the agent: {path}")
    return 0


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    fault = commands.add_parser(
        "simulate-fault", help="make a running agent's simulated GPU report an XID or fall off the bus"
    )
    fault.add_argument("--state-dir", required=True, help="the agent's --state-dir")
    fault.add_argument("--gpu", required=True, help="GPU index or UUID")
    kind = fault.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=int, help="the XID to report")
    kind.add_argument("--lost", action="store_true", help="the GPU falls off the bus (XID 79)")
    fault.set_defaults(run=run)
