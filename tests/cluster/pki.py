"""The cluster's certificates and keys, made at every start with the openssl command: one CA
that signs the API server's serving certificate and every client's (the admin in
system:masters, the controller-manager, the scheduler, the node in system:nodes, the API
server towards kubelet), and the service-account signing key pair.

ECDSA P-256 throughout: a key takes milliseconds where RSA 2048 takes a tenth of a second, and
every component accepts it.
"""

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.layout import API_ADDRESS

# The API server's names: the bridge address it listens on, the service's first address, the
# names a pod's client uses.
_API_SERVER_NAMES = (
    f"IP:{API_ADDRESS}",
    "IP:127.0.0.1",
    "IP:10.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)
_DAYS = "30"


class PkiError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Identity:
    """A client certificate: its file stem, user name and groups."""

    stem: str
    user: str
    groups: tuple[str, ...] = ()


def client_identities(node: str) -> tuple[Identity, ...]:
    return (
        Identity("admin", "kubernetes-admin", ("system:masters",)),
        Identity("kube-controller-manager", "system:kube-controller-manager"),
        Identity("kube-scheduler", "system:kube-scheduler"),
        Identity("kube-proxy", "system:kube-proxy"),
        Identity("kubelet", f"system:node:{node}", ("system:nodes",)),
        Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
    )


def _openssl(*args: str, cwd: Path) -> None:
    completed = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise PkiError(f"openssl {args[0]} exited {completed.returncode}: {completed.stderr.strip()}")


def _key(directory: Path, stem: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{stem}.key", cwd=directory)


def subject(user: str, groups: tuple[str, ...]) -> str:
    """An openssl -subj string: O= for each group (how Kubernetes reads groups), CN= the user."""
    return "".join(f"/O={group}" for group in groups) + f"/CN={user}"


def _signed(directory: Path, stem: str, subj: str, extensions: str) -> None:
    _key(directory, stem)
    _openssl("req", "-new", "-key", f"{stem}.key", "-subj", subj, "-out", f"{stem}.csr", cwd=directory)
    (directory / f"{stem}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", _DAYS, "-sha256", "-extfile", f"{stem}.ext", "-out", f"{stem}.crt",
        cwd=directory,
    )  # fmt: skip
    (directory / f"{stem}.csr").unlink()
    (directory / f"{stem}.ext").unlink()


def make_pki(directory: Path, node: str) -> None:
    """Writes ca.{crt,key}, apiserver.{crt,key}, <identity>.{crt,key} and sa.{key,pub}."""
    directory.mkdir(parents=True, exist_ok=True)
    _key(directory, "ca")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=dra-driver-e2e-ca", "-days", _DAYS,
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt",
        cwd=directory,
    )  # fmt: skip
    _signed(
        directory,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(_API_SERVER_NAMES)}\n",
    )
    for identity in client_identities(node):
        _signed(
            directory,
            identity.stem,
            subject(identity.user, identity.groups),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )
    _key(directory, "sa")
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
