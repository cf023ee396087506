"""Where the Kubernetes API server is and how the agent proves who it is: what every call uses.

Read from a kubeconfig (`kube.kubeconfig`) or from the pod's service account (`in_cluster_server`,
as the official client's in-cluster loader reads it: the same environment variables and files,
the token read again once a minute, since kubelet rotates projected tokens on disk).

A CA given inline or as a file is the only CA trusted, as kubectl and client-go trust it; the
system's bundle is loaded only for an https server with no CA configured.
"""

import os
import ssl
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Protocol

import msgspec

from dra_driver.base.errors import OperatorFault


class Credentials(Protocol):
    async def authorization(self) -> str | None:
        """The Authorization header for the next request; None: send none."""
        ...


class StaticAuthorization(msgspec.Struct, frozen=True):
    header: str | None = None

    async def authorization(self) -> str | None:
        return self.header


NO_CREDENTIALS = StaticAuthorization()


class ServerConfigError(OperatorFault, ValueError):
    """The API server's settings cannot be used; the message says which and why."""


def read_token(path: Path, field: str) -> str:
    """The token in `path`, without the line end an editor or `echo` leaves (kubectl trims it
    too). Raises ServerConfigError naming `field`."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ServerConfigError(f"{field}: {path}: {error.strerror}") from error
    if not token:
        raise ServerConfigError(f"{field}: {path}: empty")
    return token


class RotatedToken:
    """A bearer token from a file that is replaced while the agent runs (a projected
    service-account token): read at start, so a missing one fails there, and again when a
    request comes more than `reread_after` seconds after the last read. A read that fails then
    keeps the token it has: the server says 401 if that one has expired."""

    def __init__(
        self,
        path: Path,
        field: str,
        *,
        reread_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path, self._field = path, field
        self._reread_after, self._clock = reread_after, clock
        self._header = f"Bearer {read_token(path, field)}"
        self._read_at = clock()

    async def authorization(self) -> str | None:
        now = self._clock()
        if now - self._read_at >= self._reread_after:
            self._read_at = now
            with suppress(ServerConfigError):  # kept: see the class's docstring
                self._header = f"Bearer {read_token(self._path, self._field)}"
        return self._header


class ServerAccess(msgspec.Struct, frozen=True):
    """`ca_file`, `client_certificate`, `client_key`: paths ssl can load (an inline PEM is put in
    a memory file first, `kube.kubeconfig`); `ca_data`: PEM text; `proxy`: an http:// URL."""

    url: str
    ca_file: str | None = None
    ca_data: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    credentials: Credentials = NO_CREDENTIALS
    max_connections: int = 8

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for an https server, None for http. Reads the CA and the client's
        certificate and key: raises OSError (ssl.SSLError included) when they cannot be loaded."""
        if not self.url.startswith("https:"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_certificate is not None:
            context.load_cert_chain(self.client_certificate, self.client_key)
        return context


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_server(
    environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT
) -> ServerAccess:
    """The API server as a pod sees it: the kubernetes Service's address from the environment,
    the service account's CA and token. Raises ServerConfigError naming what is missing."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ServerConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT: not set (not running in a pod?)"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = account / "ca.crt"
    if not ca.is_file():
        raise ServerConfigError(f"service account CA: {ca}: no such file")
    token = RotatedToken(account / "token", "service account token")
    return ServerAccess(f"https://{host}:{port}", ca_file=str(ca), credentials=token)
