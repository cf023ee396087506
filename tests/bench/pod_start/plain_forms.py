"""The plain forms of the agent's hand-built hot-path pieces (issue 50, part 6), each the shape a
reviewer would expect in their place: the library call, or the obvious code. Pieces whose plain
form measured as good (gather/shield, the call gate, the group commit) were replaced by it in the
agent and have left this file; docs/benchmarks.md has their figures.

A benchmark variant of the agent applies some of them when `dra_driver` is imported (the pod-start
benchmark copies this file into the image's sources, `variants.py`), by rebinding every name in
`dra_driver`'s modules that refers to the piece, so `from x import y` bindings made before the
swap follow it too. Nothing here ships: it exists to measure what each piece saves.
"""

import asyncio
import fcntl
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

# -- one node-wide lock in place of per-claim byte-range locks --------------------------------


class OneLock:
    """`ClaimLocks`' plain form, upstream's: one lock for every claim, an asyncio lock inside the
    process and a flock of the lock file across processes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path.with_suffix(".one"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._local = asyncio.Lock()
        self._holders = 0

    def hold(self, claim_uid: str) -> "OneHold":
        del claim_uid
        return OneHold(self)

    def held_elsewhere(self, claim_uid: str) -> bool:
        del claim_uid
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        if not self._local.locked():
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return False

    def close(self) -> None:
        os.close(self._fd)

    def __len__(self) -> int:
        return self._holders


async def _flock(fd: int) -> None:
    """An exclusive flock without blocking the loop: another process may hold it for a while."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(0.001)


class OneHold:
    def __init__(self, locks: OneLock) -> None:
        self._locks = locks

    async def __aenter__(self) -> None:
        locks = self._locks
        locks._holders += 1
        await locks._local.acquire()
        await _flock(locks._fd)

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        locks = self._locks
        fcntl.flock(locks._fd, fcntl.LOCK_UN)
        locks._local.release()
        locks._holders -= 1


# -- one lock per call, upstream's shape -------------------------------------------------------


def call_locked_engine() -> type:
    """`ClaimEngine` with upstream's lock on top (dra-example-driver's node-wide flock around each
    call; the kubeletplugin helper serializes calls by default): a whole prepare or unprepare call
    holds one node-wide lock, so two pods' calls never overlap. The per-claim locks stay inside,
    uncontended."""
    from dra_driver.claims.engine import ClaimEngine  # noqa: PLC0415

    class CallLockedEngine(ClaimEngine):
        def __init__(self, **settings: Any) -> None:
            super().__init__(**settings)
            path = settings["records"].state_dir / "call.lock"
            self._call_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._call_local = asyncio.Lock()

        async def _one_call_at_a_time(self, call: Any) -> Any:
            async with self._call_local:
                await _flock(self._call_fd)
                try:
                    return await call
                finally:
                    fcntl.flock(self._call_fd, fcntl.LOCK_UN)

        async def prepare(self, claims: Any) -> Any:
            return await self._one_call_at_a_time(super().prepare(claims))

        async def unprepare(self, claims: Any) -> Any:
            return await self._one_call_at_a_time(super().unprepare(claims))

    return CallLockedEngine


# -- aiohttp in place of kube/kube_http.py's own HTTP/1.1 client -------------------------------


class _Answer:
    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class AiohttpStream:
    def __init__(self, response: Any) -> None:
        self.status: int = response.status
        self._response = response

    async def readline(self) -> bytes:
        line: bytes = await self._response.content.readline()
        return line

    async def read_all(self) -> bytes:
        body: bytes = await self._response.read()
        return body

    def close(self) -> None:
        self._response.close()


class AiohttpClient:
    """`KeepAliveClient`'s plain form: an aiohttp session (its pool of `max_connections`) for the
    requests, a response of its own per watch. No proxy support: the benchmark has none."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: Any,
        tls_server_name: str | None = None,
        proxy: str | None = None,
        max_connections: int = 8,
    ) -> None:
        del proxy
        self._server = server.rstrip("/")
        self._ssl = ssl_context if ssl_context is not None else False
        self._server_hostname = tls_server_name
        self._limit = max_connections
        self._session: Any = None
        self.connections_opened = 0

    def _open_session(self) -> Any:
        import aiohttp  # noqa: PLC0415 - loaded by the variant only

        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], time_limit: float, body: bytes | None = None
    ) -> _Answer:
        import aiohttp  # noqa: PLC0415

        session = self._open_session()
        async with session.request(
            method,
            self._server + path,
            headers=dict(headers),
            data=body,
            timeout=aiohttp.ClientTimeout(total=time_limit),
            server_hostname=self._server_hostname,
        ) as response:
            return _Answer(response.status, await response.read())

    async def open_stream(self, path: str, headers: Mapping[str, str], time_limit: float) -> AiohttpStream:
        import aiohttp  # noqa: PLC0415

        response = await self._open_session().get(
            self._server + path,
            headers=dict(headers),
            timeout=aiohttp.ClientTimeout(total=time_limit),
            server_hostname=self._server_hostname,
        )
        return AiohttpStream(response)

    async def open_ahead(self, time_limit: float) -> None:
        del time_limit

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


# -- the swap ----------------------------------------------------------------------------------

# variant piece -> (module, name, the plain form's factory)
PIECES: dict[str, tuple[str, str, Callable[[], object]]] = {
    "claim-locks": ("dra_driver.state.shared_locks", "ClaimLocks", lambda: OneLock),
    "http-client": ("dra_driver.kube.kube_http", "KeepAliveClient", lambda: AiohttpClient),
    "call-lock": ("dra_driver.claims.engine", "ClaimEngine", call_locked_engine),
}


def apply(pieces: list[str]) -> None:
    """Swaps each named piece for its plain form, in its module and wherever it was imported."""
    import importlib  # noqa: PLC0415

    for piece in pieces:
        module_name, name, plain = PIECES[piece]
        module = importlib.import_module(module_name)
        original, replacement = getattr(module, name), plain()
        for loaded_name, loaded in list(sys.modules.items()):
            if loaded_name.startswith("dra_driver") and loaded is not None:
                for attribute, value in list(vars(loaded).items()):
                    if value is original:
                        setattr(loaded, attribute, replacement)
        print(f"plain form: {module_name}.{name} -> {replacement.__name__}", file=sys.stderr)  # type: ignore[attr-defined]
