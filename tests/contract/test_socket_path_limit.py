"""The socket path limit the agent checks at start is gRPC's own, not the kernel's: a path the
check passes binds, one byte more is refused by the check before gRPC can refuse it at bind time
(found on the local cluster, where the agent crashed with a traceback instead)."""

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin.sockets import MAX_SOCKET_PATH_BYTES, hidden_socket_path, socket_path_problem


def _path_of_length(directory: Path, length: int) -> Path:
    prefix = f"{directory}/"
    return Path(prefix + "s" * (length - len(prefix)))


def _binds(path: Path) -> bool:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError:
        return False
    finally:
        server.stop(None)
        path.unlink(missing_ok=True)
    return True


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Below /tmp: pytest's own temporary directories are too long to leave room for the test."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="sock-") as directory:
        yield Path(directory)


def test_the_longest_path_the_check_allows_binds_with_grpc_and_one_byte_more_does_not(
    short_dir: Path,
) -> None:
    longest = _path_of_length(short_dir, MAX_SOCKET_PATH_BYTES)

    assert _binds(longest)
    assert not _binds(_path_of_length(short_dir, MAX_SOCKET_PATH_BYTES + 1))


def test_the_check_counts_the_hidden_name_the_socket_is_bound_under(short_dir: Path) -> None:
    fits = _path_of_length(short_dir, MAX_SOCKET_PATH_BYTES - 2)
    too_long = _path_of_length(short_dir, MAX_SOCKET_PATH_BYTES - 1)

    assert socket_path_problem(fits) is None
    assert _binds(hidden_socket_path(fits))
    assert socket_path_problem(too_long) is not None
    assert not _binds(hidden_socket_path(too_long))
