"""Kubeconfig files with static credentials, read without the Kubernetes client's own loader.

The client's loader (`kubernetes.aio.config.kube_config`) imports its `ApiClient` at module
level, and with it aiohttp, pydantic, python-dateutil and the generated models: about 11 MiB the
agent would keep for its whole life, and a fifth of a second of its start, to read a few fields
once. What a node agent's kubeconfig holds is
static (a server, its CA, a bearer token or a client certificate), and that is read here with the
loader's rules: inline `*-data` before a file, files relative to the kubeconfig's directory (as
kubectl has them), TLS files only for an https server, a token before a username and password.

A user section holding anything else (`exec`, `auth-provider`, a field not read here) sends the
whole file to the client's loader, imported at that moment (`kube.official_loader`): it costs the
memory, and works as it always did. A token file is read again once a minute, as client-go reads
it, so a rotated token is picked up.
"""

import base64
import binascii
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import msgspec

from dra_driver.base.yaml_files import YamlFileError, read_yaml_file
from dra_driver.kube.server_access import (
    Credentials,
    RotatedToken,
    ServerAccess,
    ServerConfigError,
    StaticAuthorization,
)

# The user fields read here; a user with any other goes to the client's loader.
STATIC_USER_FIELDS = frozenset(
    {
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
        "username",
        "password",
    }
)

# A PEM credential: the file a field names, or what its `*-data` twin held.
Pem = Path | bytes


class KubeconfigError(ServerConfigError):
    """The kubeconfig cannot be used; the message names the field, not the file."""


class StaticKubeconfig(msgspec.Struct, frozen=True):
    """The current context's settings, apart from applying them (reading files, making memory
    files) so that parsing stays a pure function of the document. Paths are resolved already;
    TLS files are left out for an http server, as the client's loader leaves them out."""

    server: str
    certificate_authority: Pem | None = None
    client_certificate: Pem | None = None
    client_key: Pem | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    # The Authorization header a token or a username and password make.
    authorization: str | None = None
    token_file: Path | None = None


def parse_kubeconfig(document: object, directory: Path) -> StaticKubeconfig | None:
    """The current context of a parsed kubeconfig whose relative paths start at `directory`;
    None when its user needs the client's loader. Raises KubeconfigError naming the field."""
    (cluster, cluster_where), (user, user_where) = _current_cluster_and_user(document)
    if not user.keys() <= STATIC_USER_FIELDS:
        return None
    server = _string(cluster, "server", cluster_where)
    if server is None or urllib.parse.urlsplit(server).scheme not in ("http", "https"):
        raise KubeconfigError(f"{cluster_where}.server: expected an http or https URL, got {server!r}")
    authority = certificate = key = None
    if server.startswith("https"):
        authority = _pem(cluster, "certificate-authority", cluster_where, directory)
        certificate = _pem(user, "client-certificate", user_where, directory)
        key = _pem(user, "client-key", user_where, directory)
    authorization, token_file = _authorization(user, user_where, directory)
    return StaticKubeconfig(
        server=server.rstrip("/"),
        certificate_authority=authority,
        client_certificate=certificate,
        client_key=key,
        insecure_skip_tls_verify=_flag(cluster, "insecure-skip-tls-verify", cluster_where),
        tls_server_name=_string(cluster, "tls-server-name", cluster_where),
        proxy_url=_string(cluster, "proxy-url", cluster_where),
        authorization=authorization,
        token_file=token_file,
    )


Section = tuple[Mapping[str, object], str]  # a mapping and the field path naming it


def _current_cluster_and_user(document: object) -> tuple[Section, Section]:
    if not isinstance(document, Mapping):
        raise KubeconfigError("expected a mapping with clusters, contexts, users and current-context")
    context_name = _string(document, "current-context", "")
    if context_name is None:
        raise KubeconfigError("current-context: not set")
    where = f"contexts[name={context_name}].context"
    context = _section(_named(document, "contexts", context_name), "context", where)
    cluster_name, user_name = _string(context, "cluster", where), _string(context, "user", where)
    if cluster_name is None:
        raise KubeconfigError(f"{where}.cluster: not set")
    cluster_where = f"clusters[name={cluster_name}].cluster"
    cluster = _section(_named(document, "clusters", cluster_name), "cluster", cluster_where)
    if user_name is None:  # no credentials
        return (cluster, cluster_where), ({}, "user")
    user_where = f"users[name={user_name}].user"
    user = _section(_named(document, "users", user_name), "user", user_where, empty_when_null=True)
    return (cluster, cluster_where), (user, user_where)


def _named(document: Mapping[str, object], list_name: str, name: str) -> Mapping[str, object]:
    entries = document.get(list_name)
    if not isinstance(entries, list):
        raise KubeconfigError(f"{list_name}: expected a list of named entries")
    found = [entry for entry in entries if isinstance(entry, Mapping) and entry.get("name") == name]
    if len(found) != 1:
        raise KubeconfigError(f"{list_name}: {len(found)} entries named {name!r}, expected one")
    entry: Mapping[str, object] = found[0]
    return entry


def _section(
    entry: Mapping[str, object], key: str, where: str, *, empty_when_null: bool = False
) -> Mapping[str, object]:
    value = entry.get(key)
    if value is None and empty_when_null:
        return {}
    if not isinstance(value, Mapping):
        raise KubeconfigError(f"{where}: expected a mapping")
    return value


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _string(section: Mapping[str, object], key: str, where: str) -> str | None:
    """The field's text; None when it is missing or empty, as the client's loader has it."""
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KubeconfigError(f"{_field(where, key)}: expected a string, got {type(value).__name__}")
    return value


def _flag(section: Mapping[str, object], key: str, where: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise KubeconfigError(f"{_field(where, key)}: expected true or false, got {value!r}")
    return value


def _pem(section: Mapping[str, object], key: str, where: str, directory: Path) -> Pem | None:
    """`key-data` decoded, else the file `key` names; a PEM block either way."""
    data = _string(section, f"{key}-data", where)
    if data is None:
        path = _string(section, key, where)
        return None if path is None else directory / path
    try:
        decoded = base64.b64decode("".join(data.split()), validate=True)
    except binascii.Error as error:
        raise KubeconfigError(f"{_field(where, key)}-data: not base64: {error}") from error
    if b"-----BEGIN " not in decoded:
        raise KubeconfigError(f"{_field(where, key)}-data: not the base64 of a PEM block")
    return decoded


def _authorization(user: Mapping[str, object], where: str, directory: Path) -> tuple[str | None, Path | None]:
    """The Authorization header the user's token or username and password make, or the token
    file to read it from."""
    token = _string(user, "token", where)
    if token is not None:
        return f"Bearer {token}", None
    token_file = _string(user, "tokenFile", where)
    if token_file is not None:
        return None, directory / token_file
    username, password = _string(user, "username", where), _string(user, "password", where)
    if username is not None and password is not None:
        return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode(), None
    return None, None


def read_kubeconfig(path: Path) -> StaticKubeconfig | None:
    """The kubeconfig at `path`, parsed; None when its user needs the client's loader."""
    try:
        document = read_yaml_file(path)
    except YamlFileError as error:
        raise KubeconfigError(str(error)) from error
    return parse_kubeconfig(document, path.absolute().parent)


async def load_kubeconfig(path: Path) -> ServerAccess:
    """The API server the current context of the kubeconfig at `path` names; one whose user needs
    more than static credentials through the client's own loader. Raises KubeconfigError (the
    file's own fields), or ServerConfigError with the client's loader's message."""
    parsed = read_kubeconfig(path)
    if parsed is None:
        # Imported only here: it brings the official client, ApiClient and pydantic with it.
        from dra_driver.kube.official_loader import server_from_client_loader  # noqa: PLC0415

        return await server_from_client_loader(path)
    return configure(parsed)


def configure(parsed: StaticKubeconfig) -> ServerAccess:
    """The settings the client's loader would make of `parsed`. Reads the token file and checks
    that the named files exist, so a missing one fails here, naming its field."""
    authority = parsed.certificate_authority
    credentials: Credentials = StaticAuthorization(parsed.authorization)
    if parsed.token_file is not None:
        try:
            credentials = RotatedToken(parsed.token_file, "tokenFile")
        except ServerConfigError as error:
            raise KubeconfigError(str(error)) from error
    return ServerAccess(
        parsed.server,
        ca_file=_existing(authority, "certificate-authority") if isinstance(authority, Path) else None,
        ca_data=authority.decode() if isinstance(authority, bytes) else None,
        client_certificate=None
        if parsed.client_certificate is None
        else _as_file(parsed.client_certificate, "client-certificate"),
        client_key=None if parsed.client_key is None else _as_file(parsed.client_key, "client-key"),
        verify=not parsed.insecure_skip_tls_verify,
        tls_server_name=parsed.tls_server_name,
        proxy=parsed.proxy_url,
        credentials=credentials,
    )


def _existing(path: Path, field: str) -> str:
    if not path.is_file():
        raise KubeconfigError(f"{field}: {path}: no such file")
    return str(path)


def _as_file(pem: Pem, field: str) -> str:
    """A path ssl can load the PEM from: ssl.SSLContext.load_cert_chain takes only paths.

    Inline data goes to an anonymous memory file (memfd), named by its /proc/self/fd path, so a
    private key never touches a disk and nothing is left behind however the process ends. Its
    descriptor is never closed: the settings naming it may build a TLS context any time.
    """
    if isinstance(pem, Path):
        return _existing(pem, field)
    descriptor = os.memfd_create(f"kubeconfig-{field}")
    with os.fdopen(descriptor, "wb", closefd=False) as file:
        file.write(pem)
    return f"/proc/self/fd/{descriptor}"
