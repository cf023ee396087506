"""`dra-driver cleanup`: delete the driver's ResourceSlices when it is uninstalled."""

import argparse
import sys

from dra_driver.commands.event_loop import run_coroutine
from dra_driver.config.option_table import DRIVER_NAME, NODE_NAME, add_options
from dra_driver.config.settings import SettingsError, cleanup_settings


def run(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import StartupError  # noqa: PLC0415
    from dra_driver.agent.kube_client import kubernetes_api_client  # noqa: PLC0415
    from dra_driver.kube.errors import ApiError  # noqa: PLC0415
    from dra_driver.kube.kubeconfig import KubeconfigError, read_kubeconfig  # noqa: PLC0415
    from dra_driver.kube.slice_api import SliceApi  # noqa: PLC0415
    from dra_driver.publish.cleanup import every_node_slice_api, refusal, remove_node_slices  # noqa: PLC0415
    from dra_driver.publish.dry_run import print_writes  # noqa: PLC0415

    settings = cleanup_settings(args)
    where = settings.node_name or "every node"
    if settings.kubeconfig_note:
        print(f"dra-driver cleanup: {settings.kubeconfig_note}", file=sys.stderr)
    if settings.kubeconfig is not None:
        try:
            read_kubeconfig(settings.kubeconfig)
        except KubeconfigError as error:
            raise SettingsError(f"--kubeconfig {settings.kubeconfig}: {error}") from error

    async def cleanup() -> int:
        api_client = await kubernetes_api_client(settings.kubeconfig)
        try:
            refused = (
                "" if args.force else await refusal(api_client, settings.driver_name, settings.node_name)
            )
            # A dry run deletes nothing, so it lists what an uninstall would leave behind even
            # while the agent still runs; the refusal is a note there.
            if refused and not args.dry_run:
                print(f"dra-driver cleanup: {refused}", file=sys.stderr)
                return 1
            if refused:
                print(
                    f"dra-driver cleanup: note: {refused} (a real cleanup would be refused)", file=sys.stderr
                )
            api = (
                SliceApi(api_client, settings.driver_name, settings.node_name)
                if settings.node_name
                else every_node_slice_api(api_client, settings.driver_name)
            )
            deletes = await remove_node_slices(api, dry_run=args.dry_run)
        finally:
            await api_client.close()
        if args.dry_run:
            print_writes(deletes)
        else:
            for delete in deletes:
                print(f"deleted resourceslice {delete.name}")
            print(f"{len(deletes)} ResourceSlice(s) of {settings.driver_name} on {where} removed")
        return 0

    try:
        return run_coroutine(cleanup())
    except (StartupError, ApiError) as error:
        print(f"dra-driver cleanup: {error}", file=sys.stderr)
        return 1


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    cleanup = commands.add_parser(
        "cleanup", help="delete this node's ResourceSlices (uninstall); the agent itself never does"
    )
    nodes = cleanup.add_mutually_exclusive_group()
    add_options(nodes, [NODE_NAME])
    nodes.add_argument("--all-nodes", action="store_true", help="the driver's slices of every node")
    add_options(cleanup, [DRIVER_NAME])
    # Not the table's --kubeconfig: KUBECONFIG is a list here, read as kubectl reads it.
    cleanup.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file; default: the first existing file of KUBECONFIG, else ~/.kube/config, "
        "else the pod's service account",
    )
    cleanup.add_argument("--dry-run", action="store_true", help="print the deletes instead of making them")
    cleanup.add_argument(
        "--force", action="store_true", help="delete even while an agent pod still runs on the node"
    )
    cleanup.set_defaults(run=run)
