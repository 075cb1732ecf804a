"""tern serve --token-hmac-secret-file: JWTs on /pubsub (src/app/serve_tokens.c).

Tokens are made here with hmac/hashlib (HS256)."""
import base64
import hashlib
import hmac
import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from conftest import SLOW

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
    return tern_factory("--token-hmac-secret-file", str(f), "--feed", "off", open_topics=False)


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
