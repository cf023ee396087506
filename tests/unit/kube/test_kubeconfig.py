"""dra_driver.kube.kubeconfig: static kubeconfigs read as the client's loader reads them, without it,
and everything else handed to that loader."""

import asyncio
import base64
import copy
import json
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from kubernetes.aio.config.kube_config import load_kube_config as client_load_kube_config

from dra_driver.agent.errors import StartupError
from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube.kube_api import Configuration, KubeClient, call, get
from dra_driver.kube.kubeconfig import (
    KubeconfigError,
    StaticKubeconfig,
    configure,
    load_kubeconfig,
    parse_kubeconfig,
    read_kubeconfig,
)

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
    """ssl loads a client certificate only from a file; the data goes to memory files, never a disk."""
    configuration = Configuration()
    configure(
        StaticKubeconfig(SERVER, certificate_authority=PEM, client_certificate=PEM, client_key=b"key\n"),
        configuration,
    )
    assert configuration.ca_cert_data == PEM.decode()
    assert configuration.ssl_ca_cert is None
    assert Path(configuration.cert_file).read_bytes() == PEM
    assert Path(configuration.key_file).read_bytes() == b"key\n"
    assert Path(configuration.key_file).resolve().name.startswith("memfd:kubeconfig-client-key")


def test_the_token_file_is_read_once_and_trimmed(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    configuration = Configuration()
    configure(StaticKubeconfig(SERVER, token_file=tmp_path / "token"), configuration)
    assert configuration.api_key == {"BearerToken": "Bearer abc"}


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
        configure(parsed, Configuration())


def test_an_empty_token_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(KubeconfigError, match=r"tokenFile: .*: empty"):
        configure(StaticKubeconfig(SERVER, token_file=tmp_path / "token"), Configuration())


def test_an_exec_user_is_loaded_by_the_clients_own_loader(tmp_path: Path) -> None:
    """The loader here runs no plugins: a token from one proves the client's loader ran."""
    answer = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(answer))})"],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig({"server": SERVER}, {"exec": plugin})))
    configuration = Configuration()
    asyncio.run(load_kubeconfig(path, configuration))
    assert configuration.host == SERVER
    assert configuration.api_key == {"BearerToken": "Bearer from-the-plugin"}


def test_a_certificate_ssl_cannot_load_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(kubeconfig({"server": SERVER, "certificate-authority-data": b64(PEM)}, {}))
    )
    with pytest.raises(StartupError, match=f"^--kubeconfig {path}: cannot set up TLS for the Kubernetes API"):
        asyncio.run(kubernetes_api_client(path))


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


def _as_used(configuration: Any) -> dict[str, object]:
    """What a Configuration makes the REST layer do: CA, client pair and token by content."""

    def content(path: str | None) -> bytes | None:
        return None if path is None else Path(path).read_bytes()

    ca_data = configuration.ca_cert_data
    return {
        "host": configuration.host,
        "ca": ca_data.encode() if ca_data is not None else content(configuration.ssl_ca_cert),
        "certificate": content(configuration.cert_file),
        "key": content(configuration.key_file),
        "verify_ssl": configuration.verify_ssl,
        "tls_server_name": configuration.tls_server_name,
        "proxy": configuration.proxy,
        "api_key": configuration.api_key,
    }


def test_static_kubeconfigs_configure_the_client_as_its_own_loader_does(pki: Pki, tmp_path: Path) -> None:
    for name, document in _static_kubeconfigs(pki, tmp_path).items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        ours, theirs = Configuration(), Configuration()
        asyncio.run(load_kubeconfig(path, ours))
        asyncio.run(client_load_kube_config(config_file=str(path), client_configuration=theirs))
        assert _as_used(ours) == _as_used(theirs), name
        KubeClient(ours)  # the REST layer takes it: CA and client pair load


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


def _tls_kubeconfig(pki: Pki, port: int, **cluster: str) -> dict[str, Any]:
    return kubeconfig(
        {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority-data": b64(pki.certificate.read_bytes()),
            **cluster,
        },
        {
            "client-certificate-data": b64(pki.certificate.read_bytes()),
            "client-key-data": b64(pki.key.read_bytes()),
            "token": "abc",
        },
    )


@pytest.mark.usefixtures("no_proxy")
def test_the_agent_talks_tls_with_a_client_certificate_from_inline_data(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"

    async def version_call() -> tuple[int, list[dict[str, object]]]:
        async with tls_server(pki) as (port, seen):
            path.write_text(
                yaml.safe_dump(_tls_kubeconfig(pki, port, **{"tls-server-name": "apiserver.test"}))
            )
            client = await kubernetes_api_client(path)
            try:
                response = await call(client, "GET", "/version/", request_timeout=10)
                response.release()
                return response.status, seen
            finally:
                await client.close()

    status, seen = asyncio.run(version_call())
    assert status == 200
    assert seen[0]["authorization"] == "Bearer abc"
    assert seen[0]["peer"] and "apiserver.test" in str(seen[0]["peer"])


@pytest.mark.usefixtures("no_proxy")
def test_the_server_certificate_is_checked_against_the_ca_and_the_name(pki: Pki, tmp_path: Path) -> None:
    """Without tls-server-name the name is 127.0.0.1, which the certificate does not carry; with
    another CA, the certificate is unknown."""
    path = tmp_path / "kubeconfig"
    other_ca = {"certificate-authority-data": b64(pki.other_certificate.read_bytes())}

    async def failures() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        async with tls_server(pki) as (port, _):
            for cluster in ({}, {"tls-server-name": "apiserver.test", **other_ca}):
                path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, **cluster)))
                client = await kubernetes_api_client(path)
                try:
                    await call(client, "GET", "/version/", request_timeout=10)
                except aiohttp.ClientConnectorCertificateError as error:
                    raised.append(type(error))
                finally:
                    await client.close()
        return raised

    assert asyncio.run(failures()) == [aiohttp.ClientConnectorCertificateError] * 2


@pytest.mark.usefixtures("no_proxy")
def test_the_lean_claim_get_talks_the_same_tls(pki: Pki, tmp_path: Path) -> None:
    """kube_http's pool takes the REST layer's TLS context (client certificate, CA) and the
    server name, and so checks the server's certificate as the REST layer does."""
    path = tmp_path / "kubeconfig"
    other_ca = {"certificate-authority-data": b64(pki.other_certificate.read_bytes())}
    clusters: list[dict[str, str]] = [{"tls-server-name": "apiserver.test"}, {}]
    clusters.append({"tls-server-name": "apiserver.test", **other_ca})

    async def attempts() -> tuple[list[object], list[dict[str, object]]]:
        outcomes: list[object] = []
        async with tls_server(pki) as (port, seen):
            for cluster in clusters:
                path.write_text(yaml.safe_dump(_tls_kubeconfig(pki, port, **cluster)))
                client = await kubernetes_api_client(path)
                assert client.keep_alive is not None
                try:
                    answer = await get(client, "/version/", path_params={}, request_timeout=10)
                    outcomes.append((answer.status, json.loads(answer.body)["minor"]))
                except ssl.SSLCertVerificationError as error:
                    outcomes.append(error.verify_code)  # what the REST layer raises as its cause
                finally:
                    await client.close()
        return outcomes, seen

    outcomes, seen = asyncio.run(attempts())
    assert outcomes[0] == (200, "35")
    # Without tls-server-name the name checked is 127.0.0.1 (OpenSSL's X509_V_ERR_IP_ADDRESS_MISMATCH);
    # with the other CA the server's self-signed certificate is unknown (DEPTH_ZERO_SELF_SIGNED_CERT).
    assert outcomes[1:] == [64, 18]
    assert seen[0]["authorization"] == "Bearer abc"
    assert seen[0]["peer"] and "apiserver.test" in str(seen[0]["peer"])
