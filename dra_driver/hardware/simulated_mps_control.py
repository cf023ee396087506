"""The simulated nvidia-cuda-mps-control: the program a simulated node's MPS daemons run, as
`python -m dra_driver.hardware.simulated_mps_control`, speaking the real one's protocol.

`-d` daemonizes like the real one: the launcher returns once the daemon is up, and the daemon
runs in a session of its own, so it survives the agent. `-f` serves in the foreground (a pod's
only process). Without an argument, stdin goes to the running daemon and its reply to stdout.
The daemon serves the pipe directory in CUDA_MPS_PIPE_DIRECTORY and records what it was told in
`SETTINGS_FILE` there, which is mounted into the claim's containers, so tests can check it from
the host and from inside a container.

`--client` plays a CUDA program of a container that reaches the daemon: it reports its UID and
the MPS client settings in its environment (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), which the daemon records per client, and it is told, as MPS
would, whether a server of its UID serves it now or it waits: one daemon runs a server for one
Linux user at a time, and clients of another user queue until that server's clients are gone
(nvidia-cuda-mps-control(1)). `--client-exit PID` tells the daemon that client has exited.

It runs in a process of its own for every command the agent sends, so it imports nothing but
the standard library: its start is part of preparing an MPS claim.
"""

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

MODULE = "dra_driver.hardware.simulated_mps_control"
SETTINGS_FILE = "simulated-mps.json"
_PID_FILE = "nvidia-cuda-mps-control.pid"
_START_TIMEOUT_S = 10.0


class _Daemon:
    """One claim's daemon: where it serves, and what it was told so far (kept in `SETTINGS_FILE`).
    A plain class: the program imports neither dataclasses nor typing, to start fast."""

    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.control = pipe / "control"
        self.pid_file = pipe / _PID_FILE
        self.settings_file = pipe / SETTINGS_FILE
        self.active_thread_percentage: int | None = None
        self.pinned_mem_limits: dict[str, str] = {}
        self.commands: list[str] = []
        # The UID the server runs as (None: no server), and the clients it serves.
        self.server_uid: int | None = None
        self.clients: list[dict[str, object]] = []

    def save(self) -> None:
        """Whole or not at all: a test may read the file while the daemon writes it."""
        settings = {
            "pid": os.getpid(),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "pipe_directory": str(self.pipe),
            "log_directory": str(self.log),
            "active_thread_percentage": self.active_thread_percentage,
            "pinned_mem_limits": self.pinned_mem_limits,
            "commands": self.commands,
            "server_uid": self.server_uid,
            "clients": self.clients,
        }
        temporary = self.settings_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(settings, indent=2))
        temporary.replace(self.settings_file)

    def execute(self, line: str) -> str:
        words = line.split()
        with (self.log / "control.log").open("a") as control_log:
            control_log.write(f"Cmd:{line}\n")
        self.commands.append(line)
        if words[0] == "set_default_active_thread_percentage" and len(words) == 2 and words[1].isdigit():
            self.active_thread_percentage = int(words[1])
        elif words[0] == "set_default_device_pinned_mem_limit" and len(words) == 3:
            self.pinned_mem_limits[words[1]] = words[2]
        elif words[0] == "client_connect" and len(words) == 5:
            return self.connect(int(words[1]), int(words[2]), words[3], words[4])
        elif words[0] == "client_exit" and len(words) == 2:
            self.clients = [client for client in self.clients if client["pid"] != int(words[1])]
            if not self.clients:
                self.server_uid = None
        elif words != ["quit"]:
            return f"error: unknown command {line!r}"
        return "ok"

    def connect(self, uid: int, pid: int, threads: str, memory: str) -> str:
        if self.server_uid is not None and self.server_uid != uid:
            return (
                f"queued: the server of uid {self.server_uid} serves {len(self.clients)} clients; "
                f"uid {uid} waits until they exit"
            )
        self.server_uid = uid
        self.clients.append(
            {
                "uid": uid,
                "pid": pid,
                "active_thread_percentage": None if threads == "-" else int(threads),
                "pinned_device_mem_limit": None if memory == "-" else memory,
            }
        )
        return f"connected: server of uid {uid}"


def _serve(daemon: _Daemon, server: socket.socket) -> None:
    daemon.save()
    daemon.pid_file.write_text(f"{os.getpid()}\n")
    while True:
        connection, _ = server.accept()
        with connection:
            received = b""
            while chunk := connection.recv(4096):
                received += chunk
            lines = [line.strip() for line in received.decode().splitlines() if line.strip()]
            replies = [daemon.execute(line) for line in lines]
            daemon.save()
            if "quit" in lines:
                daemon.pid_file.unlink()
                daemon.control.unlink()
            # A client that went away (one that only checked the socket) ends nothing.
            with contextlib.suppress(OSError):
                connection.sendall("".join(reply + "\n" for reply in replies).encode())
        if "quit" in lines:
            return


def _listen(daemon: _Daemon) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(daemon.control))
    # Clients of every user reach the daemon (connecting needs write permission on the socket).
    daemon.control.chmod(0o666)
    server.listen()
    return server


def _start(daemon: _Daemon) -> None:
    """Bound before forking, so a command sent as soon as the launcher returns finds the socket."""
    server = _listen(daemon)
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not daemon.pid_file.exists():
            if time.monotonic() > deadline:
                sys.exit("the simulated MPS control daemon did not start")
            time.sleep(0.01)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for descriptor in (0, 1, 2):
        os.dup2(null, descriptor)
    _serve(daemon, server)
    os._exit(0)


def _client(pipe: Path, arguments: list[str]) -> int:
    """A CUDA program's side: 0 when a server serves it, 3 when it is queued."""
    if arguments == ["--client"]:
        threads = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or "-"
        memory = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") or "-"
        command = f"client_connect {os.getuid()} {os.getpid()} {threads} {memory}\n"
    else:
        command = f"client_exit {arguments[1]}\n"
    reply = _exchange(pipe / "control", command)
    sys.stdout.write(reply)
    return 3 if reply.startswith("queued") else 1 if "error" in reply else 0


def _exchange(control: Path, commands: str) -> str:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(control))
    except OSError as error:
        sys.exit(f"cannot reach the MPS control daemon at {control}: {error}")
    client.sendall(commands.encode())
    client.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := client.recv(4096):
        reply += chunk
    return reply.decode()


def _send(daemon: _Daemon) -> int:
    reply = _exchange(daemon.control, sys.stdin.read())
    sys.stdout.write(reply)
    return 1 if "error" in reply else 0


def main(arguments: list[str]) -> int:
    if arguments[:1] in (["--client"], ["--client-exit"]):
        return _client(Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"]), arguments)
    daemon = _Daemon(Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"]), Path(os.environ["CUDA_MPS_LOG_DIRECTORY"]))
    if arguments == ["-d"]:
        _start(daemon)
    elif arguments == ["-f"]:  # serves until "quit" or a signal ends it
        _serve(daemon, _listen(daemon))
    else:
        return _send(daemon)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
