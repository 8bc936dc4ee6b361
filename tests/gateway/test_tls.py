"""An https:// worker: a fake worker served over TLS (a certificate for 127.0.0.1 signed by a CA made here), the
gateway trusting that CA through `SSL_CERT_FILE`, as an operator's private CA would be trusted.

Chat turns (streamed and not), health checks and load reports all reach it over TLS; a gateway that trusts another CA
refuses the worker's certificate and says so.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.gateway.app import create_app
from sessiongate.gateway.errors import WorkerUnreachable
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.state import GatewayState
from sessiongate.gateway.workers.pool import worker_id_for
from tests.conftest import WithLifespanState, fake_workers

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "one two three four five"}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_ca(folder: Path, name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """A self-signed CA; its certificate written to `folder/<name>.pem` (a bundle `SSL_CERT_FILE` can name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def _write_leaf(folder: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> tuple[Path, Path]:
    """The worker's certificate for 127.0.0.1, signed by `ca`: (certificate file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fake worker"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / "worker.pem", folder / "worker.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@contextlib.asynccontextmanager
async def _tls_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, trust_the_workers_ca: bool
) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayState, FakeWorkerBehaviour, str]]:
    """The gateway in front of one fake worker served over TLS; it trusts the worker's CA, or another one."""
    ca_key, ca, ca_path = _write_ca(tmp_path, "worker-ca")
    _, _, other_ca_path = _write_ca(tmp_path, "other-ca")
    cert, key = _write_leaf(tmp_path, ca_key, ca)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path if trust_the_workers_ca else other_ca_path))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    behaviour = FakeWorkerBehaviour()
    async with fake_workers({"worker": behaviour}, ssl_certfile=str(cert), ssl_keyfile=str(key)) as urls:
        url = urls["worker"]
        assert url.startswith("https://")
        settings = GatewaySettings(
            workers=(url,),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
            allow_unauthenticated=True,
            health_interval_s=0.05,
            load_poll_interval_s=0.02,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app) as state:
            served = WithLifespanState(app, state)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=served), base_url="http://gateway"
            ) as client:
                yield client, state["gateway"], behaviour, url


async def _stream(client: httpx.AsyncClient, session: str) -> tuple[int, bytes]:
    body: dict[str, Any] = {"messages": [USER], "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as answer:
        return answer.status_code, await answer.aread()


async def test_a_worker_over_tls_serves_streamed_and_non_streamed_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _tls_gateway(tmp_path, monkeypatch, trust_the_workers_ca=True) as (client, state, behaviour, url):
        (worker,) = state.workers.workers
        assert worker.healthy  # the health check went over TLS

        answer = await client.post("/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "t-1"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].startswith("echo:")
        assert answer.headers["x-sessiongate-worker"] == worker_id_for(url)

        status, streamed = await _stream(client, "t-2")
        assert status == 200
        assert b'"content":"echo' in streamed
        assert streamed.endswith(b"data: [DONE]\n\n")

        assert len(behaviour.requests) == 2
        turns = (await client.get("/v1/sessions/t-2/turns")).json()["data"]
        assert [t["status"] for t in turns] == ["ok"]
        assert worker.extension is True  # its load reports came over TLS as well


async def test_a_worker_whose_certificate_the_gateway_does_not_trust_fails_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _tls_gateway(tmp_path, monkeypatch, trust_the_workers_ca=False) as (client, state, behaviour, url):
        (worker,) = state.workers.workers
        assert not worker.healthy
        assert worker.last_error is not None
        assert "certificate verify failed" in worker.last_error  # what /v1/admin/workers and the logs show

        answer = await client.post("/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "t-3"})
        assert answer.status_code == 503  # no worker to route to

        # The turn's own client, asked directly, names the certificate as the reason, streamed or not.
        worker_id = worker_id_for(url)
        with pytest.raises(WorkerUnreachable) as refused:
            await state.worker_client.chat(worker_id, url, {"messages": [USER]})
        assert refused.value.status_code == 502
        assert "its TLS certificate was not accepted" in refused.value.message
        assert refused.value.message.startswith(f"Worker {worker_id} failed before answering: its TLS certificate")
        assert "issuer" in refused.value.message  # OpenSSL's reason: no trusted issuer for the worker's certificate
        with pytest.raises(WorkerUnreachable, match="its TLS certificate was not accepted"):
            await state.worker_client.open_stream(worker_id, url, {"messages": [USER], "stream": True})
        assert behaviour.requests == []  # nothing was sent to a worker the gateway could not verify
