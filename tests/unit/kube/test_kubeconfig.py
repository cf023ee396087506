"""dra_driver.kube.kubeconfig: static kubeconfigs read as the client's loader reads them, without it,
and everything else handed to that loader."""

import asyncio
import base64
import copy
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes.aio.client.configuration import Configuration
from kubernetes.aio.config.kube_config import load_kube_config as client_load_kube_config

from dra_driver.agent.errors import StartupError
from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube.calls import json_call
from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.kube.kubeconfig import (
    KubeconfigError,
    StaticKubeconfig,
    configure,
    load_kubeconfig,
    parse_kubeconfig,
    read_kubeconfig,
)
from dra_driver.kube.server_access import RotatedToken, ServerAccess, ServerConfigError

SERVER = "https://apiserver.example:6443"
HERE = Path("/etc/kube")


def kubeconfig(cluster: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    """A kubeconfig whose current context names one cluster and (unless None) one user, next to
    decoys of the same kind that must not be read."""
    context: dict[str, Any] = {"cluster": "c"} if user is None else {"cluster": "c", "user": "u"}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://other:6443"}},
            {"name": "c", "cluster": cluster},
        ],
        "users": [{"name": "other", "user": {"token": "not-this"}}, {"name": "u", "user": user}],
        "contexts": [{"name": "other", "context": {"cluster": "other"}}, {"name": "ctx", "context": context}],
    }


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("cluster", "user", "expected"),
    [
        pytest.param({"server": SERVER + "/"}, None, StaticKubeconfig(SERVER), id="server-no-user"),
        pytest.param({"server": SERVER}, {}, StaticKubeconfig(SERVER), id="empty-user"),
        pytest.param(
            {"server": SERVER, "certificate-authority": "pki/ca.crt"},
            {},
            StaticKubeconfig(SERVER, certificate_authority=HERE / "pki/ca.crt"),
            id="ca-relative",
        ),
        pytest.param(
            {"server": SERVER, "certificate-authority": "/pki/ca.crt"},
            {},
            StaticKubeconfig(SERVER, certificate_authority=Path("/pki/ca.crt")),
            id="ca-absolute",
        ),
        pytest.param(
            {"server": SERVER, "certificate-authority-data": b64(PEM), "certificate-authority": "ignored"},
            {},
            StaticKubeconfig(SERVER, certificate_authority=PEM),
            id="ca-data-before-file",
        ),
        pytest.param(
            {"server": SERVER, "insecure-skip-tls-verify": True},
            {},
            StaticKubeconfig(SERVER, insecure_skip_tls_verify=True),
            id="insecure",
        ),
        pytest.param(
            {"server": SERVER, "tls-server-name": "kubernetes.default", "proxy-url": "http://proxy:3128"},
            {},
            StaticKubeconfig(SERVER, tls_server_name="kubernetes.default", proxy_url="http://proxy:3128"),
            id="sni-proxy",
        ),
        pytest.param(
            {"server": SERVER},
            {"token": "abc", "tokenFile": "t", "username": "u", "password": "p"},
            StaticKubeconfig(SERVER, authorization="Bearer abc"),
            id="token-first",
        ),
        pytest.param(
            {"server": SERVER},
            {"tokenFile": "secrets/token", "username": "u", "password": "p"},
            StaticKubeconfig(SERVER, token_file=HERE / "secrets/token"),
            id="token-file-then",
        ),
        pytest.param(
            {"server": SERVER},
            {"username": "admin", "password": "s3cret"},
            StaticKubeconfig(SERVER, authorization="Basic " + b64(b"admin:s3cret")),
            id="basic",
        ),
        pytest.param(
            {"server": SERVER},
            {"client-certificate": "me.crt", "client-key": "/keys/me.key"},
            StaticKubeconfig(SERVER, client_certificate=HERE / "me.crt", client_key=Path("/keys/me.key")),
            id="client-files",
        ),
        pytest.param(
            {"server": SERVER},
            {"client-certificate-data": b64(PEM), "client-key-data": b64(PEM), "client-key": "ignored"},
            StaticKubeconfig(SERVER, client_certificate=PEM, client_key=PEM),
            id="client-data",
        ),
        pytest.param(
            {"server": "http://127.0.0.1:8080", "certificate-authority": "ca.crt"},
            {"client-certificate": "me.crt", "client-key": "me.key", "token": "abc"},
            StaticKubeconfig("http://127.0.0.1:8080", authorization="Bearer abc"),
            id="http-ignores-tls-files",
        ),
    ],
)
def test_each_field_of_a_static_kubeconfig(
    cluster: dict[str, Any], user: dict[str, Any] | None, expected: StaticKubeconfig
) -> None:
    assert parse_kubeconfig(kubeconfig(cluster, user), HERE) == expected


def test_a_user_without_a_section_has_no_credentials() -> None:
    document = kubeconfig({"server": SERVER}, {})
    document["users"][1]["user"] = None
    assert parse_kubeconfig(document, HERE) == StaticKubeconfig(SERVER)


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"command": "get-token", "apiVersion": "client.authentication.k8s.io/v1"}},
        {"auth-provider": {"name": "oidc", "config": {}}},
        {"token": "abc", "as": "someone-else"},
    ],
    ids=["exec", "auth-provider", "unknown-field"],
)
def test_a_user_beyond_static_credentials_is_left_to_the_clients_loader(user: dict[str, Any]) -> None:
    assert parse_kubeconfig(kubeconfig({"server": SERVER}, user), HERE) is None


def _without(document: dict[str, Any], *path: str | int) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target: Any = changed
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return changed


def _with(document: dict[str, Any], value: object, *path: str | int) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target: Any = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


GOOD = kubeconfig({"server": SERVER}, {"token": "abc"})


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (["not", "a", "mapping"], "expected a mapping"),
        (_without(GOOD, "current-context"), "current-context: not set"),
        (_with(GOOD, "nowhere", "current-context"), "contexts: 0 entries named 'nowhere'"),
        (_with(GOOD, GOOD["contexts"] * 2, "contexts"), "contexts: 2 entries named 'ctx', expected one"),
        (_with(GOOD, "ctx", "contexts"), "contexts: expected a list"),
        (_with(GOOD, None, "contexts", 1, "context"), "contexts[name=ctx].context: expected a mapping"),
        (_without(GOOD, "contexts", 1, "context", "cluster"), "contexts[name=ctx].context.cluster: not set"),
        (_with(GOOD, "gone", "contexts", 1, "context", "user"), "users: 0 entries named 'gone'"),
        (_without(GOOD, "clusters", 1, "cluster", "server"), "clusters[name=c].cluster.server"),
        (
            _with(GOOD, "apiserver:6443", "clusters", 1, "cluster", "server"),
            "clusters[name=c].cluster.server",
        ),
        (_with(GOOD, 6443, "clusters", 1, "cluster", "server"), "clusters[name=c].cluster.server"),
        (
            _with(GOOD, "yes", "clusters", 1, "cluster", "insecure-skip-tls-verify"),
            "clusters[name=c].cluster.insecure-skip-tls-verify: expected true or false",
        ),
        (
            _with(GOOD, "!!", "clusters", 1, "cluster", "certificate-authority-data"),
            "clusters[name=c].cluster.certificate-authority-data: not base64",
        ),
        (
            _with(GOOD, b64(b"not pem"), "clusters", 1, "cluster", "certificate-authority-data"),
            "clusters[name=c].cluster.certificate-authority-data: not the base64 of a PEM block",
        ),
        (_with(GOOD, ["abc"], "users", 1, "user", "token"), "users[name=u].user.token: expected a string"),
        (_with(GOOD, "abc", "users", 1, "user"), "users[name=u].user: expected a mapping"),
        (
            _with(GOOD, PEM.decode(), "users", 1, "user", "client-key-data"),
            "users[name=u].user.client-key-data: not base64",
        ),
    ],
)
def test_a_malformed_kubeconfig_is_an_error_naming_the_field(document: object, field: str) -> None:
    with pytest.raises(KubeconfigError) as raised:
        parse_kubeconfig(document, HERE)
    assert field in str(raised.value)


def test_relative_paths_start_at_the_kubeconfigs_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig({"server": SERVER, "certificate-authority": "ca.crt"}, {})))
    parsed = read_kubeconfig(path)
    assert parsed is not None and parsed.certificate_authority == tmp_path / "conf" / "ca.crt"


@pytest.mark.parametrize(
    ("content", "message"),
    [("clusters: [", "not valid YAML"), (None, "cannot read it")],
)
def test_an_unreadable_file_is_an_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KubeconfigError, match=message):
        read_kubeconfig(path)


def test_inline_client_credentials_become_files_only_this_process_can_read() -> None:
    """ssl loads a client certificate only from a file; the data goes to memory files, never a disk.
    The CA is handed to ssl as text."""
    access = configure(
        StaticKubeconfig(SERVER, certificate_authority=PEM, client_certificate=PEM, client_key=b"key\n")
    )
    assert access.ca_data == PEM.decode()
    assert access.ca_file is None
    assert access.client_certificate is not None and access.client_key is not None
    assert Path(access.client_certificate).read_bytes() == PEM
    assert Path(access.client_key).read_bytes() == b"key\n"
    assert Path(access.client_key).resolve().name.startswith("memfd:kubeconfig-client-key")


async def test_the_token_file_is_read_at_once_and_trimmed(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    access = configure(StaticKubeconfig(SERVER, token_file=tmp_path / "token"))
    (tmp_path / "token").unlink()  # read already: within the minute it is not read again
    assert await access.credentials.authorization() == "Bearer abc"


async def test_a_token_file_rewritten_on_disk_is_read_again_after_a_minute(tmp_path: Path) -> None:
    """As client-go does, so that a rotated token is picked up; the file is the one named relative
    to the kubeconfig's directory, not to the working directory."""
    (tmp_path / "conf" / "secrets").mkdir(parents=True)
    token_file = tmp_path / "conf" / "secrets" / "token"
    token_file.write_text("first\n")
    path = tmp_path / "conf" / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig({"server": SERVER}, {"tokenFile": "secrets/token"})))
    token = (await load_kubeconfig(path)).credentials
    assert isinstance(token, RotatedToken)
    later = [0.0]
    token._clock = lambda: time.monotonic() + later[0]

    async def headers() -> list[str | None]:
        seen = [await token.authorization()]
        token_file.write_text("second\n")
        seen.append(await token.authorization())  # within the minute: the token read at start
        later[0] = 61.0
        seen.append(await token.authorization())
        return seen

    assert await headers() == ["Bearer first", "Bearer first", "Bearer second"]


@pytest.mark.parametrize(
    ("parsed", "field"),
    [
        (
            StaticKubeconfig(SERVER, certificate_authority=Path("/nonexistent/ca.crt")),
            "certificate-authority",
        ),
        (StaticKubeconfig(SERVER, client_certificate=Path("/nonexistent/me.crt")), "client-certificate"),
        (StaticKubeconfig(SERVER, client_key=Path("/nonexistent/me.key")), "client-key"),
        (StaticKubeconfig(SERVER, token_file=Path("/nonexistent/token")), "tokenFile"),
    ],
)
def test_a_missing_file_is_an_error_naming_its_field(parsed: StaticKubeconfig, field: str) -> None:
    with pytest.raises(KubeconfigError, match=f"^{field}: /nonexistent/"):
        configure(parsed)


def test_an_empty_token_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(KubeconfigError, match=r"tokenFile: .*: empty"):
        configure(StaticKubeconfig(SERVER, token_file=tmp_path / "token"))


def exec_plugin(token: str) -> dict[str, Any]:
    """A kubeconfig user's `exec` section whose plugin prints an ExecCredential with `token`."""
    answer = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    return {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "sh",
        "args": ["-c", f"printf '%s' '{json.dumps(answer)}'"],
        "interactiveMode": "Never",
    }


async def test_an_exec_user_is_loaded_by_the_clients_own_loader(tmp_path: Path) -> None:
    """The code here runs no plugins: a token from one proves the client's loader ran, and that the
    credentials it leaves behind hand that token on."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig({"server": SERVER + "/"}, {"exec": exec_plugin("from-exec")})))

    async def loaded() -> tuple[ServerAccess, str | None]:
        access = await load_kubeconfig(path)
        return access, await access.credentials.authorization()

    access, authorization = await loaded()
    assert access.url == SERVER
    assert authorization == "Bearer from-exec"


def counting_exec_plugin(directory: Path, expires: str) -> dict[str, Any]:
    """An exec plugin that counts its runs in `directory`/runs and gives token t<run> that
    expires at `expires`."""
    script = directory / "plugin.sh"
    script.write_text(
        'n=$(( $(cat "$0.runs" 2>/dev/null || echo 0) + 1 )); echo $n > "$0.runs"\n'
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"t%s","expirationTimestamp":"{expires}"}}}}\' "$n"\n'
    )
    return {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "sh",
        "args": [str(script)],
        "interactiveMode": "Never",
    }


@pytest.mark.parametrize(
    ("expires", "tokens", "runs"),
    [("2000-01-01T00:00:00Z", ["Bearer t2", "Bearer t3"], 3), ("2999-01-01T00:00:00Z", ["Bearer t1"] * 2, 1)],
    ids=["expired", "valid"],
)
async def test_an_exec_plugin_runs_again_once_its_credential_has_expired(
    tmp_path: Path, expires: str, tokens: list[str], runs: int
) -> None:
    """The official loader runs the plugin when it loads and sets no refresh hook: a long-running
    agent would send an expired token for ever."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(kubeconfig({"server": SERVER}, {"exec": counting_exec_plugin(tmp_path, expires)}))
    )

    async def headers() -> list[str | None]:
        access = await load_kubeconfig(path)
        return [await access.credentials.authorization() for _ in range(2)]

    assert await headers() == tokens  # the load ran it once already
    assert (tmp_path / "plugin.sh.runs").read_text().strip() == str(runs)


async def test_an_exec_plugin_that_fails_stops_the_start(tmp_path: Path) -> None:
    """The official loader only logs a failing plugin; the agent would run without credentials."""
    plugin = {**exec_plugin("unused"), "args": ["-c", "echo broken >&2; exit 3"]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig({"server": SERVER}, {"exec": plugin})))
    with pytest.raises(ServerConfigError, match="exec: the credential plugin gave no token"):
        await load_kubeconfig(path)


async def test_a_certificate_ssl_cannot_load_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(kubeconfig({"server": SERVER, "certificate-authority-data": b64(PEM)}, {}))
    )
    with pytest.raises(StartupError, match=f"^--kubeconfig {path}: cannot set up TLS for the Kubernetes API"):
        await kubernetes_api_client(path)


# -- against the client's loader and a real TLS server ------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A self-signed certificate for apiserver.test (no IP in it), its key, and a stranger's."""

    certificate: Path
    key: Path
    other_certificate: Path


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    certificate, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
            "-keyout", str(key), "-out", str(certificate),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return certificate, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    # A real TLS server needs real certificates: a missing openssl fails these tests, not skips them.
    assert shutil.which("openssl"), "openssl is not installed: apt-get install openssl, as .ci/run does"
    directory = tmp_path_factory.mktemp("pki")
    return Pki(*_self_signed(directory, "apiserver.test"), _self_signed(directory, "someone.else")[0])


def _static_kubeconfigs(pki: Pki, directory: Path) -> dict[str, dict[str, Any]]:
    """Kubeconfigs in `directory`, with copies of the PKI files beside them for relative paths."""
    for source in (pki.certificate, pki.key):
        shutil.copy(source, directory / source.name)
    (directory / "token").write_text("file-token")
    certificate, key = pki.certificate.read_bytes(), pki.key.read_bytes()
    return {
        "token-ca-file": kubeconfig(
            {"server": SERVER, "certificate-authority": pki.certificate.name}, {"token": "abc"}
        ),
        "token-file-ca-data": kubeconfig(
            {"server": SERVER + "/", "certificate-authority-data": b64(certificate)}, {"tokenFile": "token"}
        ),
        "client-files": kubeconfig(
            {"server": SERVER, "certificate-authority": str(pki.certificate), "tls-server-name": "x.test"},
            {"client-certificate": pki.certificate.name, "client-key": pki.key.name},
        ),
        "client-data": kubeconfig(
            {"server": SERVER, "certificate-authority-data": b64(certificate), "proxy-url": "http://p:3128"},
            {"client-certificate-data": b64(certificate), "client-key-data": b64(key)},
        ),
        "insecure-basic": kubeconfig(
            {"server": SERVER, "insecure-skip-tls-verify": True}, {"username": "u", "password": "p"}
        ),
        "plain-http": kubeconfig({"server": "http://127.0.0.1:8080"}, {}),
    }


def _content(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


async def _as_ours_is_used(access: ServerAccess) -> dict[str, object]:
    """What our settings make the client do: CA, client pair by content, the Authorization sent."""
    return {
        "host": access.url,
        "ca": access.ca_data.encode() if access.ca_data is not None else _content(access.ca_file),
        "certificate": _content(access.client_certificate),
        "key": _content(access.client_key),
        "verify_ssl": access.verify,
        "tls_server_name": access.tls_server_name,
        "proxy": access.proxy,
        "authorization": await access.credentials.authorization(),
    }


async def _as_theirs_is_used(configuration: Any) -> dict[str, object]:
    """The same of the official client's Configuration (its REST layer's view of it)."""
    ca_data = configuration.ca_cert_data
    bearer = (await configuration.auth_settings()).get("BearerToken")
    return {
        "host": configuration.host,
        "ca": ca_data.encode() if ca_data is not None else _content(configuration.ssl_ca_cert),
        "certificate": _content(configuration.cert_file),
        "key": _content(configuration.key_file),
        "verify_ssl": configuration.verify_ssl,
        "tls_server_name": configuration.tls_server_name,
        "proxy": configuration.proxy,
        "authorization": None if bearer is None else bearer["value"],
    }


async def test_static_kubeconfigs_configure_the_client_as_its_own_loader_does(
    pki: Pki, tmp_path: Path
) -> None:
    async def both(path: Path) -> tuple[dict[str, object], dict[str, object]]:
        ours, theirs = await load_kubeconfig(path), Configuration()
        await client_load_kube_config(config_file=str(path), client_configuration=theirs)
        KubeClient(ours)  # our client takes it: CA and client pair load
        return await _as_ours_is_used(ours), await _as_theirs_is_used(theirs)

    authorizations = {}
    for name, document in _static_kubeconfigs(pki, tmp_path).items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        ours, theirs = await both(path)
        assert ours == theirs, name
        authorizations[name] = ours["authorization"]
    # The headers agree because both send one, not because neither does.
    assert authorizations == {
        "token-ca-file": "Bearer abc",
        "token-file-ca-data": "Bearer file-token",
        "client-files": None,
        "client-data": None,
        "insecure-basic": "Basic " + b64(b"u:p"),
        "plain-http": None,
    }


@asynccontextmanager
async def tls_server(pki: Pki) -> AsyncIterator[tuple[int, list[dict[str, object]]]]:
    """An HTTPS server that asks for a client certificate signed by the test CA and records who
    called with what."""
    seen: list[dict[str, object]] = []

    async def version(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        seen.append({"authorization": request.headers.get("Authorization"), "peer": peer})
        return web.json_response({"major": "1", "minor": "35"})

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.certificate))
    context.load_cert_chain(pki.certificate, pki.key)
    context.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_get("/version/", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield


def _tls_kubeconfig(
    pki: Pki, port: int, cluster: Mapping[str, object], user: Mapping[str, object] | None = None
) -> dict[str, Any]:
    """A kubeconfig for the test server: its CA, the client pair, a token (unless `user` says
    otherwise); `cluster` adds to or replaces the cluster's fields ("" drops one)."""
    return kubeconfig(
        {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority-data": b64(pki.certificate.read_bytes()),
            **cluster,
        },
        {
            "client-certificate-data": b64(pki.certificate.read_bytes()),
            "client-key-data": b64(pki.key.read_bytes()),
            **(user if user is not None else {"token": "abc"}),
        },
    )


VERSION = "/version/"
NAMED: dict[str, object] = {"tls-server-name": "apiserver.test"}  # the name the server's certificate carries


@pytest.mark.usefixtures("no_proxy")
async def test_the_agent_talks_tls_with_a_client_certificate_from_inline_data(
    pki: Pki, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"

    async def version_call() -> tuple[dict[str, Any], int, list[dict[str, object]]]:
        async with tls_server(pki) as (port, seen):
            path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, NAMED)))
            client = await kubernetes_api_client(path)
            try:
                version = await json_call("version", call(client, "GET", VERSION, request_timeout=10))
                return version, client.http.connections_opened, seen
            finally:
                await client.close()

    version, opened, seen = await version_call()
    assert version == {"major": "1", "minor": "35"}
    assert opened == 1  # over our own pool
    assert seen[0]["authorization"] == "Bearer abc"
    assert seen[0]["peer"] and "apiserver.test" in str(seen[0]["peer"])


@asynccontextmanager
async def tunnelling_proxy() -> AsyncIterator[tuple[int, list[str]]]:
    """An HTTP proxy that opens the tunnel a CONNECT asks for and pipes bytes both ways; yields its
    port and the CONNECT lines it was sent."""
    asked: list[str] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line = head.split("\r\n")[0]
        asked.append(request_line)
        host, _, port = request_line.split(" ")[1].rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], asked


async def test_the_agent_talks_tls_to_the_server_through_a_proxys_tunnel(pki: Pki, tmp_path: Path) -> None:
    """proxy-url with an https server: the TLS handshake (server name, CA, client certificate)
    runs inside the tunnel the proxy opened, end to end with the server."""
    path = tmp_path / "kubeconfig"

    async def version_call() -> tuple[dict[str, Any], list[str], list[dict[str, object]]]:
        async with tls_server(pki) as (port, seen), tunnelling_proxy() as (proxy_port, asked):
            proxied = {**NAMED, "proxy-url": f"http://127.0.0.1:{proxy_port}"}
            path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, proxied)))
            client = await kubernetes_api_client(path)
            try:
                version = await json_call("version", call(client, "GET", VERSION, request_timeout=10))
                return version, asked, seen
            finally:
                await client.close()

    version, asked, seen = await version_call()
    assert version == {"major": "1", "minor": "35"}
    assert len(asked) == 1 and asked[0].startswith("CONNECT 127.0.0.1:") and asked[0].endswith(" HTTP/1.1")
    assert seen[0]["authorization"] == "Bearer abc"
    assert seen[0]["peer"] and "apiserver.test" in str(seen[0]["peer"])


@pytest.mark.usefixtures("no_proxy")
async def test_an_exec_user_talks_tls_with_the_token_of_its_plugin(pki: Pki, tmp_path: Path) -> None:
    """The client's loader reads the file (its CA and client pair to temporary files); our client
    takes them from it, and the plugin's token."""
    path = tmp_path / "kubeconfig"

    async def version_call() -> tuple[dict[str, Any], list[dict[str, object]]]:
        async with tls_server(pki) as (port, seen):
            user = {"exec": exec_plugin("from-exec")}
            path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, NAMED, user)))
            client = await kubernetes_api_client(path)
            try:
                return await json_call("version", call(client, "GET", VERSION, request_timeout=10)), seen
            finally:
                await client.close()

    version, seen = await version_call()
    assert version == {"major": "1", "minor": "35"}
    assert seen[0]["authorization"] == "Bearer from-exec"
    assert seen[0]["peer"] and "apiserver.test" in str(seen[0]["peer"])


@pytest.mark.usefixtures("no_proxy")
async def test_the_server_certificate_is_checked_against_the_ca_and_the_name(
    pki: Pki, tmp_path: Path
) -> None:
    """Without tls-server-name the name is 127.0.0.1, which the certificate does not carry; with
    another CA, the certificate is unknown: either way a call has no answer, and says why."""
    path = tmp_path / "kubeconfig"
    other_ca: dict[str, object] = {"certificate-authority-data": b64(pki.other_certificate.read_bytes())}

    async def failures() -> list[ApiError]:
        raised: list[ApiError] = []
        async with tls_server(pki) as (port, seen):
            for cluster in ({}, {**NAMED, **other_ca}):
                path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, cluster)))
                client = await kubernetes_api_client(path)
                try:
                    await json_call("version", call(client, "GET", VERSION, request_timeout=10))
                except ApiError as error:
                    raised.append(error)
                finally:
                    await client.close()
            assert seen == []  # no request got through
        return raised

    raised = await failures()
    assert [(error.status, type(error.__cause__)) for error in raised] == [
        (0, ssl.SSLCertVerificationError)
    ] * 2
    assert all(error.no_answer and "certificate verify failed" in error.message for error in raised)


@pytest.mark.usefixtures("no_proxy")
async def test_the_pool_checks_the_certificate_as_configured(pki: Pki, tmp_path: Path) -> None:
    """What OpenSSL says, request by request on the pool itself: the name, then the CA; and
    insecure-skip-tls-verify (with no CA) checks neither, the client certificate still sent."""
    path = tmp_path / "kubeconfig"
    other_ca: dict[str, object] = {"certificate-authority-data": b64(pki.other_certificate.read_bytes())}
    insecure: dict[str, object] = {"insecure-skip-tls-verify": True, "certificate-authority-data": ""}
    clusters: list[dict[str, object]] = [NAMED, {}, {**NAMED, **other_ca}, insecure]

    async def attempts() -> tuple[list[object], list[dict[str, object]]]:
        outcomes: list[object] = []
        async with tls_server(pki) as (port, seen):
            for cluster in clusters:
                path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, cluster)))
                client = await kubernetes_api_client(path)
                try:
                    answer = await client.http.request("GET", VERSION, {}, 5)
                    outcomes.append((answer.status, json.loads(answer.body)["minor"]))
                except ssl.SSLCertVerificationError as error:
                    outcomes.append(error.verify_code)
                finally:
                    await client.close()
        return outcomes, seen

    outcomes, seen = await attempts()
    # Without tls-server-name the name checked is 127.0.0.1 (OpenSSL's X509_V_ERR_IP_ADDRESS_MISMATCH);
    # with the other CA the server's self-signed certificate is unknown (DEPTH_ZERO_SELF_SIGNED_CERT).
    assert outcomes == [(200, "35"), 64, 18, (200, "35")]
    assert [entry["authorization"] for entry in seen] == [None, None]  # none was given to send
    assert all(entry["peer"] and "apiserver.test" in str(entry["peer"]) for entry in seen)
