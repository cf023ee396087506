"""`dra-driver demo`: prepare a sample claim on a simulated node, with no cluster."""

import argparse
import sys

from dra_driver.commands.event_loop import run_coroutine
from dra_driver.config.option_table import HARDWARE, add_options
from dra_driver.config.option_values import OptionProblem, optional_absolute_path
from dra_driver.config.settings import parse_hardware


def run(args: argparse.Namespace) -> int:
    from dra_driver.observability.logs import configure_logging  # noqa: PLC0415
    from dra_driver.tools.demo import claim_choice, demo_claims, run_demo  # noqa: PLC0415

    hardware = str(parse_hardware(args.hardware))
    try:
        cdi_dir = optional_absolute_path(args.cdi_dir)
    except OptionProblem as error:
        print(f"dra-driver demo: --cdi-dir: {error}", file=sys.stderr)
        return 2
    # Before anything is logged: a claim the node cannot take is the one line printed (cli.main).
    claims = run_coroutine(demo_claims(claim_choice(args.claim), hardware))
    configure_logging("console", 0)
    failed = run_coroutine(run_demo(claims, hardware, run_container=not args.no_container, cdi_dir=cdi_dir))
    for uid, error_text in failed.items():
        print(f"dra-driver demo: claim {uid} was not prepared: {error_text}", file=sys.stderr)
    return 1 if failed else 0


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from dra_driver.tools.demo import DEFAULT_CLAIM, DEFAULT_HARDWARE  # noqa: PLC0415

    demo = commands.add_parser("demo", help="prepare a sample claim on a simulated node, no cluster needed")
    demo.add_argument(
        "--claim",
        "--claim-file",
        default=DEFAULT_CLAIM,
        metavar="gpu|mig|vgpu|FILE",
        help="a sample claim for a device of that kind on the node, or allocated ResourceClaim(s) "
        "as YAML; default: %(default)s",
    )
    add_options(demo, [HARDWARE.but(default=DEFAULT_HARDWARE, help="simulated node to run on")], env=False)
    demo.add_argument(
        "--no-container", action="store_true", help="do not run a container even if podman works"
    )
    demo.add_argument(
        "--cdi-dir",
        metavar="DIR",
        help="write the CDI spec here; default: a private directory, which podman does not read, so "
        "no container runs (--cdi-dir /var/run/cdi: the host's, where podman reads it)",
    )
    demo.set_defaults(run=run)
