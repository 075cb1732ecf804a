"""tern serve --token-hmac-secret-file: JWTs on /pubsub (src/app/serve_tokens.c).

Tokens are made here with hmac/hashlib (HS256) and the openssl command
(RS256). The claim rules run over ws and wss, with websockets' asyncio
client (its threaded one is not safe over TLS: see test_tls)."""
import asyncio
import base64
import hashlib
import hmac
import json
import ssl
import subprocess
import time

import pytest
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from conftest import SLOW
from test_tls import certs  # noqa: F401  (the session's certificates)

SECRET = b"integration-secret"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(claims, secret=SECRET, alg="HS256"):
    head = b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    signed = f"{head}.{body}".encode()
    sig = hmac.new(secret, signed, hashlib.sha256).digest() if alg == "HS256" else b""
    return f"{head}.{body}.{b64(sig)}"


def claims(ttl=3600, **rights):
    return {"sub": "tester", "exp": int(time.time()) + ttl, "tern": rights}


@pytest.fixture
def served(tern_factory, tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    # No leeway: the tests of exp below see the claim itself (the leeway
    # has its own test).
    return tern_factory("--token-hmac-secret-file", str(f), "--token-leeway", "0", "--feed", "off",
                        open_topics=False)


def url(t, tok=None):
    return f"ws://127.0.0.1:{t.port}/pubsub" + (f"?token={tok}" if tok else "")


def ask(ws, **msg):
    ws.send(json.dumps(msg))
    return json.loads(ws.recv(timeout=5 * SLOW))


@pytest.mark.parametrize("bad", [
    token(claims(), secret=b"wrong"),
    token(claims(), alg="none"),
    token(claims(ttl=-10)),
    "not.a.token",
])
def test_bad_token_gets_401(served, bad):
    with pytest.raises(InvalidStatus) as e:
        connect(url(served, bad), open_timeout=5 * SLOW)
    assert e.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as e:
        connect(url(served), additional_headers={"Authorization": f"Bearer {bad}"},
                open_timeout=5 * SLOW)
    assert e.value.response.status_code == 401


def test_anonymous_reads_the_open_topics_only(served):
    with connect(url(served)) as ws:
        assert ask(ws, op="subscribe", topic="market")["ok"] == "subscribe"
        assert ask(ws, op="subscribe", topic="stats")["ok"] == "subscribe"
        assert ask(ws, op="subscribe", topic="orders.x") == {"error": "forbidden",
                                                              "op": "subscribe"}
        assert ask(ws, op="publish", topic="market", data="x") == {"error": "forbidden",
                                                                    "op": "publish"}
        assert ask(ws, op="refresh", token="x.y.z") == {"error": "bad token", "op": "refresh"}


def test_publish_rights_by_prefix(served):
    tok = token(claims(publish=["chat.*"], subscribe=["chat.*"]))
    with connect(url(served), additional_headers={"Authorization": f"Bearer {tok}"}) as ws:
        assert ask(ws, op="subscribe", topic="chat.room")["ok"] == "subscribe"
        ws.send(json.dumps({"op": "publish", "topic": "chat.room", "data": "hi"}))
        # the message (the sender is a subscriber) and the ack, in either order
        got = [json.loads(ws.recv(timeout=5 * SLOW)) for _ in range(2)]
        assert {"ok": "publish", "topic": "chat.room", "seq": 1} in got, got
        assert any(m.get("topic") == "chat.room" and m.get("data") == "hi" for m in got), got
        assert ask(ws, op="publish", topic="market", data="x")["error"] == "forbidden"
        assert ask(ws, op="subscribe", topic="orders.x")["error"] == "forbidden"


def test_expiry_closes_with_4001(served):
    with connect(url(served, token(claims(ttl=2, subscribe=["a"])))) as ws:
        assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=10 * SLOW)
        assert e.value.rcvd.code == 4001 and e.value.rcvd.reason == "token expired"


def test_refresh_before_exp_keeps_it_open(served):
    with connect(url(served, token(claims(ttl=2)))) as ws:
        new = claims(ttl=3600, subscribe=["orders.*"])
        r = ask(ws, op="refresh", token=token(new))
        assert r == {"ok": "refresh", "exp": new["exp"]}
        # a bad refresh is answered and changes nothing
        assert ask(ws, op="refresh", token=token(new, secret=b"no"))["error"] == "bad token"
        time.sleep(3.5)
        assert ask(ws, op="subscribe", topic="orders.1")["ok"] == "subscribe"


# ---- every claim rule, over ws and wss, with both kinds of key ----------

def rs256_token(claims_, key_pem):
    """RS256, signed by the openssl command (no Python crypto package needed)."""
    head = b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims_).encode())
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key_pem],
                         input=f"{head}.{body}".encode(), capture_output=True, check=True).stdout
    return f"{head}.{body}.{b64(sig)}"


@pytest.fixture(scope="module")
def rsa_keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("rsa")
    key, pub = str(d / "key.pem"), str(d / "pub.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                    "-out", key], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True,
                   capture_output=True)
    return key, pub


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_claims_and_keys(tern_factory, certs, tmp_path, rsa_keys, scheme):  # noqa: F811
    key, pub = rsa_keys
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    tls = []
    if scheme == "wss":
        cert, tkey = certs["default"]
        tls = ["--tls-port", "0", "--tls-cert", cert, "--tls-key", tkey]
    t = tern_factory("--token-hmac-secret-file", str(f), "--token-public-key-file", pub,
                     "--token-audience", "tern-test", "--token-issuer", "https://id.test",
                     "--feed", "off", *tls, open_topics=False)
    ctx = None
    base = f"ws://127.0.0.1:{t.port}/pubsub"
    if scheme == "wss":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        base = f"wss://127.0.0.1:{t.tls_port}/pubsub"
    now = int(time.time())

    def c(**over):
        out = {"sub": "u1", "exp": now + 3600, "aud": "tern-test", "iss": "https://id.test",
               "tern": {"subscribe": ["orders.u1"], "publish": ["orders.u1"]}}
        out.update(over)
        return {k: v for k, v in out.items() if v is not None}

    async def status(tok):
        """101 and a working subscribe, or the refusal's HTTP status."""
        try:
            async with aconnect(f"{base}?token={tok}", ssl=ctx) as ws:
                await ws.send(json.dumps({"op": "subscribe", "topic": "orders.u1"}))
                m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
                assert m["ok"] == "subscribe", m
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    async def go():
        assert await status(token(c())) == 101
        assert await status(rs256_token(c(), key)) == 101
        assert await status(token(c(exp=now - 40))) == 401             # expired, past the leeway
        assert await status(token(c(nbf=now + 600))) == 401            # not yet valid
        assert await status(token(c(), secret=b"wrong")) == 401         # wrongly signed
        assert await status(token(c(aud="other"))) == 401              # wrong audience
        assert await status(token(c(aud=None))) == 401                 # none, when one is set
        assert await status(token(c(iss="https://evil.test"))) == 401  # wrong issuer
        assert await status(token(c(sub=None))) == 401                 # no subject
        assert await status(token(c(), alg="none")) == 401             # alg none
        # HS256 "signed" with the public key's PEM: the key is not a secret
        assert await status(token(c(), secret=open(pub, "rb").read())) == 401
        # an RS256 token whose signature is another key's
        other = tmp_path / "other.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-out", str(other)],
                       check=True, capture_output=True)
        assert await status(rs256_token(c(), str(other))) == 401
    asyncio.run(go())


def test_refresh_with_an_expired_token_is_refused_then_exp_closes(served):
    with connect(url(served, token(claims(ttl=3, subscribe=["a"])))) as ws:
        assert ask(ws, op="refresh", token=token(claims(ttl=-5)))["error"] == "bad token"
        assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=10 * SLOW)
        assert e.value.rcvd.code == 4001


# ---- one leeway on exp and nbf (--token-leeway, default 30 s) --------------

@pytest.mark.parametrize("leeway", [None, "0"])
def test_leeway_applies_to_exp(tern_factory, tmp_path, leeway):
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    args = ["--token-leeway", leeway] if leeway else []
    t = tern_factory("--token-hmac-secret-file", str(f), *args, "--feed", "off", open_topics=False)

    def status(ttl):
        try:
            with connect(url(t, token(claims(ttl=ttl, subscribe=["a"]))),
                         open_timeout=5 * SLOW) as ws:
                assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    # expired 10 s ago: within the default leeway of 30 s, not within 0
    assert status(-10) == (101 if leeway is None else 401)
    # expired 40 s ago: past either
    assert status(-40) == 401
    # nbf 10 s ahead: the same leeway
    nbf = token(dict(claims(subscribe=["a"]), nbf=int(time.time()) + 10))
    try:
        with connect(url(t, nbf), open_timeout=5 * SLOW):
            got = 101
    except InvalidStatus as e:
        got = e.response.status_code
    assert got == (101 if leeway is None else 401)


def test_leeway_keeps_a_connection_open_past_exp(tern_factory, tmp_path):
    """The expiry closes at exp plus the leeway, when verify would refuse the
    token, not at exp: with a leeway of 2 s a token expiring in 1 s keeps its
    connection open for about 3 s."""
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    t = tern_factory("--token-hmac-secret-file", str(f), "--token-leeway", "2", "--feed", "off",
                     open_topics=False)
    start = time.monotonic()
    with connect(url(t, token(claims(ttl=1, subscribe=["a"])))) as ws:
        assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=10 * SLOW)
        assert e.value.rcvd.code == 4001
    assert time.monotonic() - start > 1.5
