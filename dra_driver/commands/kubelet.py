"""`dra-driver kubelet-client`: talk to a running plugin's sockets the way kubelet does."""

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from dra_driver.commands.event_loop import run_coroutine
from dra_driver.config.option_table import DRIVER_NAME, PLUGINS_DIR, REGISTRAR_DIR, add_options
from dra_driver.config.settings import SettingsError


def run(args: argparse.Namespace) -> int:
    from dra_driver.kube.k8s_names import driver_name_problem  # noqa: PLC0415
    from dra_driver.tools import kubelet_client, kubelet_sockets  # noqa: PLC0415

    if problem := driver_name_problem(args.driver_name):
        raise SettingsError(f"--driver-name: {problem}")
    try:
        claims = [kubelet_client.ClaimArg.parse(text) for text in getattr(args, "claim", None) or []]
    except ValueError as error:
        raise SettingsError(f"--claim: {error}") from error
    try:
        if args.action == "register":
            socket_path = _given_socket("--registration-socket", args.registration_socket)
            if socket_path is None:
                socket_path = kubelet_sockets.live_registration_socket(
                    Path(args.registrar_dir), args.driver_name
                )
            if args.notify or args.reject:
                result = run_coroutine(kubelet_client.register(socket_path, args.reject))
                _print_yaml(result)
                return 0 if result["registered"] else 1
            info = run_coroutine(kubelet_client.plugin_info(socket_path))
            _print_yaml(info)
            print(
                "dra-driver kubelet-client: NotifyRegistrationStatus not sent, so the plugin's "
                "registration state is unchanged; --notify sends it as kubelet does (the plugin "
                "then reports itself registered and ready)",
                file=sys.stderr,
            )
            return 0 if info["kubeletWouldRegister"] else 1
        socket_path = _given_socket("--socket", args.socket) or kubelet_sockets.live_dra_socket(
            Path(args.plugins_dir), args.driver_name
        )
        call = kubelet_client.prepare if args.action == "prepare" else kubelet_client.unprepare
        answer = run_coroutine(call(socket_path, args.api, claims))
    except (kubelet_client.KubeletClientError, kubelet_sockets.NoLiveSocketError) as error:
        print(f"dra-driver kubelet-client: {error}", file=sys.stderr)
        return 1
    _print_yaml(answer)
    return 1 if any(entry.get("error") for entry in answer["claims"].values()) else 0


def _print_yaml(data: Any) -> None:
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))


def _given_socket(flag: str, value: str | None) -> Path | None:
    """An explicitly named socket must be one; a missing one is the operator's typo, not a failure."""
    if value is None:
        return None
    path = Path(value)
    if not path.is_socket():
        raise SettingsError(f"{flag}: {value} is not a unix socket")
    return path


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The agent's variables are not read: this is a probe of a plugin, maybe another one's."""
    client = commands.add_parser("kubelet-client", help="talk to a plugin the way kubelet does")
    actions = client.add_subparsers(dest="action", required=True)
    register = actions.add_parser(
        "register", help="GetInfo on the registration socket; --notify completes the handshake"
    )
    register.add_argument(
        "--registration-socket",
        help="default: the newest live <driver>[-<pod uid>]-reg.sock in --registrar-dir",
    )
    add_options(register, [REGISTRAR_DIR], env=False)
    answer = register.add_mutually_exclusive_group()
    answer.add_argument(
        "--notify",
        action="store_true",
        help="send NotifyRegistrationStatus(registered) as kubelet does: the plugin then reports ready",
    )
    answer.add_argument(
        "--reject",
        default="",
        metavar="REASON",
        help="send a refused registration with this error, as kubelet would",
    )
    add_options(register, [DRIVER_NAME], env=False)
    for name in ("prepare", "unprepare"):
        call = actions.add_parser(name, help=f"Node{name.capitalize()}Resources on a DRA socket")
        call.add_argument(
            "--socket", help="default: the newest live dra[-<pod uid>].sock in <plugins-dir>/<driver-name>"
        )
        add_options(call, [PLUGINS_DIR, DRIVER_NAME], env=False)
        call.add_argument("--api", choices=("v1", "v1beta1"), default="v1", help="DRAPlugin API version")
        call.add_argument(
            "--claim",
            action="append",
            required=True,
            metavar="NAMESPACE/NAME/UID",
            help="a claim to send; repeat for several",
        )
    client.set_defaults(run=run)
