"""Auth callout against a real nats-server: granted permissions hold, refused connections fail."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import anyio
import nats
import pytest

from nvcf_mono.bus.callout import (
    CALLOUT_SUBJECT,
    AuthorizationRequest,
    CalloutError,
    Grant,
    Issuer,
    authorization_response,
    decode_jwt,
    encode_jwt,
    envelope,
    open_envelope,
)
from nvcf_mono.bus.embedded import find_nats_server
from nvcf_mono.ports import spare_port
from nvcf_mono.testing.nats_server import raw_client


def _server(tmp_path: Path, issuer: Issuer) -> tuple[subprocess.Popen[bytes], str]:
    port = spare_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"""
listen: "127.0.0.1:{port}"
authorization {{
  users: [ {{ user: "svc", password: "pw" }} ]
  auth_callout {{
    issuer: "{issuer.public_key}"
    auth_users: [ "svc" ]
  }}
}}
"""
    )
    proc = subprocess.Popen([str(find_nats_server(None)), "-c", str(conf)], stderr=subprocess.DEVNULL)
    return proc, f"nats://127.0.0.1:{port}"


async def _wait_port(url: str) -> None:
    host, port = url.removeprefix("nats://").split(":")
    with anyio.fail_after(10):
        while True:
            try:
                stream = await anyio.connect_tcp(host, int(port))
                await stream.aclose()
                return
            except OSError:
                await anyio.sleep(0.02)


def test_jwts_round_trip_and_reject_forgeries() -> None:
    issuer = Issuer(os.urandom(32))
    token = encode_jwt({"iss": issuer.public_key, "sub": "x", "nats": {"type": "user"}}, issuer)
    assert decode_jwt(token)["sub"] == "x"
    header, payload, signature = token.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged["sub"] = "y"
    with pytest.raises(CalloutError):
        decode_jwt(".".join((header, base64.urlsafe_b64encode(json.dumps(forged).encode()).decode(), signature)))
    with pytest.raises(CalloutError):
        decode_jwt(token, issuer_prefix="N")  # an account key, not a server's


def test_envelopes_read_padded_and_unpadded() -> None:
    token = envelope("APP", "worker", "p")
    assert open_envelope(token) == ("APP", "worker", "p")
    assert open_envelope(token + "=" * (-len(token) % 4)) == ("APP", "worker", "p")
    with pytest.raises(CalloutError):
        open_envelope("not-base64!")


async def test_a_granted_connection_gets_exactly_its_permissions(tmp_path: Path) -> None:
    issuer = Issuer(os.urandom(32))
    proc, url = _server(tmp_path, issuer)
    try:
        await _wait_port(url)
        service = await nats.connect(url, user="svc", password="pw")
        seen: list[AuthorizationRequest] = []

        async def answer(msg: nats.aio.msg.Msg) -> None:
            request = AuthorizationRequest.decode(msg.data.decode())
            seen.append(request)
            if open_envelope(request.token)[2] == "good":
                grant = Grant(name="w", publish=("allowed.>",), subscribe=("allowed.>", "_INBOX.>"))
                await msg.respond(authorization_response(request, issuer, grant=grant))
            else:
                await msg.respond(authorization_response(request, issuer, error="unknown token"))

        await service.subscribe(CALLOUT_SUBJECT, cb=answer)  # test-only callback subscription
        await service.flush()

        errors: list[Exception] = []

        async def on_error(err: Exception) -> None:
            errors.append(err)

        client = await nats.connect(url, token=envelope("APP", "worker", "good"), error_cb=on_error)
        received = await client.subscribe("allowed.x")
        await client.publish("allowed.x", b"ok")
        assert (await received.next_msg(timeout=5)).data == b"ok"
        await client.publish("forbidden.x", b"no")
        await client.flush()
        with anyio.fail_after(5):
            while not errors:
                await anyio.sleep(0.02)
        assert "permissions violation" in str(errors[0]).lower()
        await client.close()
        assert seen and seen[0].user_nkey.startswith("U") and seen[0].server_id

        with pytest.raises((nats.errors.NoServersError, nats.errors.Error, OSError)):
            await raw_client(
                url,
                token=envelope("APP", "worker", "bad"),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
        await service.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
