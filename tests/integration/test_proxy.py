"""tern serve --proxy-connect / --proxy-subscribe / --proxy-publish:
/pubsub's connections and operations decided by the application's backend over HTTP (src/app/serve_proxy.c,
its HTTP client src/app/http_client.c); and GET /sse's streams, whose
connect, topics and refresh the same backend decides (src/app/serve_sse.c).

The backend is an aiohttp server on a thread of its own; what it answers
depends on the topic's first word (see Backend.answer). Requests it is
told to hold wait until the test releases them, so that the tests of
requests in flight wait for a condition, never for time to pass."""
import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.request

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from conftest import SLOW, wait_for
from test_sse import SSE, status_of
from test_stream import Stream, run
from test_tokens import SECRET, claims, token


class Backend:
    """The application's backend: records each request's JSON, answers by
    the channel's first word (before the first '.'):
      ok       {"result":{}}
      deny     {"error":{"code":4403,"message":"not yours"}}
      kick     {"disconnect":{"code":4500,"reason":"bye"}}
      bad      a body that is not JSON
      oops     HTTP 500
      rewrite  {"result":{"data":"replaced"}} (a publish's data replaced)
      hold     nothing until release(), then {"result":{}}
    and a connect by its URL's last part (/connect/WHAT):
      alice    {"result":{"user":"alice","info":{"name":"Alice"}}}
      deny     {"error":{"code":4403,"message":"go away"}}
      hold     nothing until release(), then {"result":{}}
      expiring {"result":{"user":"bob","expire_at":NOW+1}}
      rights   {"result":{"user":"carol","tern":{"subscribe":["news.*"],
               "publish":["news.local"]}}}
    and a refresh likewise (/refresh/WHAT):
      extend   {"result":{"expire_at":NOW+3600}}
      expire   {"result":{"expired":true}}"""

    def __init__(self):
        self.requests = []
        self.peers = set()   # the client ports requests came from (kept-alive: few)
        self.held = 0
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.release_event = asyncio.Event()
        app = web.Application()
        app.router.add_post("/subscribe", self.answer)
        app.router.add_post("/publish", self.answer)
        app.router.add_post("/connect/{what}", self.connect)
        app.router.add_post("/refresh/{what}", self.refresh)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.started.set()
        self.loop.run_forever()

    async def answer(self, request):
        self.peers.add(request.transport.get_extra_info("peername")[1])
        body = await request.json()
        self.requests.append((request.path, body))
        word = body["channel"].split(".")[0]
        if word == "hold":
            self.held += 1
            await self.release_event.wait()
            return web.json_response({"result": {}})
        if word == "deny":
            return web.json_response({"error": {"code": 4403, "message": "not yours"}})
        if word == "kick":
            return web.json_response({"disconnect": {"code": 4500, "reason": "bye"}})
        if word == "bad":
            return web.Response(text="this is not json", content_type="application/json")
        if word == "oops":
            return web.Response(status=500, text="boom")
        if word == "rewrite":
            return web.json_response({"result": {"data": "replaced"}})
        return web.json_response({"result": {}})

    async def connect(self, request):
        body = await request.json()
        self.requests.append((request.path, body))
        what = request.match_info["what"]
        if what == "hold":
            self.held += 1
            await self.release_event.wait()
            return web.json_response({"result": {}})
        if what == "deny":
            return web.json_response({"error": {"code": 4403, "message": "go away"}})
        if what == "rights":
            return web.json_response({"result": {"user": "carol", "tern": {
                "subscribe": ["news.*"], "publish": ["news.local"]}}})
        if what == "expiring":
            return web.json_response({"result": {"user": "bob",
                                                 "expire_at": int(time.time()) + 1}})
        return web.json_response({"result": {"user": "alice", "info": {"name": "Alice"}}})

    async def refresh(self, request):
        body = await request.json()
        self.requests.append((request.path, body))
        if request.match_info["what"] == "expire":
            return web.json_response({"result": {"expired": True}})
        return web.json_response({"result": {"expire_at": int(time.time()) + 3600}})

    def release(self):
        self.loop.call_soon_threadsafe(self.release_event.set)

    def release_event_reset(self):
        asyncio.run_coroutine_threadsafe(self._reset(), self.loop).result(10)

    async def _reset(self):
        self.release_event.clear()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self):
        self.release()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def backend():
    b = Backend()
    yield b
    b.close()


def ws_url(t):
    return f"ws://127.0.0.1:{t.port}/pubsub"


def ask(ws, **msg):
    ws.send(json.dumps(msg))
    return json.loads(ws.recv(timeout=5 * SLOW))


def metrics(t):
    with urllib.request.urlopen(f"{t.admin_base}/metrics", timeout=5 * SLOW) as r:
        return r.read().decode()


def served(tern_factory, backend, *extra):
    # Closed topics (no rule opens them): what is allowed, the backend allows.
    return tern_factory("--proxy-subscribe", backend.url("/subscribe"),
                        "--proxy-publish", backend.url("/publish"), "--feed", "off", *extra,
                        open_topics=False)


def test_backend_allows_and_denies(tern_factory, backend):
    t = served(tern_factory, backend)
    with connect(ws_url(t)) as ws:
        got = ask(ws, op="subscribe", topic="ok.room")
        assert got["ok"] == "subscribe" and got["topic"] == "ok.room"
        assert ask(ws, op="subscribe", topic="deny.room") == {
            "error": "forbidden", "op": "subscribe", "topic": "deny.room", "code": 4403,
            "message": "not yours"}
        ws.send(json.dumps({"op": "publish", "topic": "ok.room", "data": "hello"}))
        # The message (the sender is a subscriber) and the ack, in either order.
        got = [json.loads(ws.recv(timeout=5 * SLOW)) for _ in range(2)]
        assert {"topic": "ok.room", "seq": 1, "data": "hello"} in got
        assert {"ok": "publish", "topic": "ok.room", "seq": 1} in got
        assert ask(ws, op="publish", topic="deny.room", data="x")["error"] == "forbidden"
    path, body = backend.requests[0]
    assert path == "/subscribe"
    assert body == {"transport": "websocket", "protocol": "json", "user": "", "channel": "ok.room"}
    pub = [b for p, b in backend.requests if p == "/publish"][0]
    assert pub["channel"] == "ok.room" and pub["data"] == "hello"
    text = metrics(t)
    assert 'tern_proxy_requests_total{kind="subscribe"} 2' in text
    assert 'tern_proxy_requests_total{kind="publish"} 2' in text
    assert 'tern_proxy_latency_seconds_count{kind="subscribe"} 2' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["tern_proxy_latency_seconds"].type == "histogram"
    assert families["tern_proxy_errors"].type == "counter"
    # One loop, one request at a time: one connection, kept alive.
    assert len(backend.peers) == 1, backend.peers


def test_publish_payload_replaced(tern_factory, backend):
    t = served(tern_factory, backend)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="rewrite.room")["ok"] == "subscribe"
        ws.send(json.dumps({"op": "publish", "topic": "rewrite.room", "data": "original"}))
        got = [json.loads(ws.recv(timeout=5 * SLOW)) for _ in range(2)]
        assert {"topic": "rewrite.room", "seq": 1, "data": "replaced"} in got


def test_backend_disconnects(tern_factory, backend):
    t = served(tern_factory, backend)
    with connect(ws_url(t)) as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "kick.room"}))
        with pytest.raises(Exception):
            ws.recv(timeout=5 * SLOW)
        assert ws.close_code == 4500 and ws.close_reason == "bye"


@pytest.mark.parametrize("word,error,reason", [
    ("bad", "proxy bad answer", "bad_answer"),
    ("oops", "proxy error", "status"),
])
def test_unusable_answers_refuse(tern_factory, backend, word, error, reason):
    t = served(tern_factory, backend)
    lines = t.lines()
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic=f"{word}.a") == {"error": error, "op": "subscribe"}
        assert ask(ws, op="subscribe", topic=f"{word}.b") == {"error": error, "op": "subscribe"}
        # The backend answering again is said once too.
        assert ask(ws, op="subscribe", topic="ok.c")["ok"] == "subscribe"
    lines.wait(r"the subscribe proxy .*: ")
    lines.wait(r"the subscribe proxy .* answers again")
    assert f'tern_proxy_errors_total{{kind="subscribe",reason="{reason}"}} 2' in metrics(t)
    t.stop()
    # One line for the two failures of the same reason, not one per request.
    assert t.stderr.count("the subscribe proxy") == 2, t.stderr


def test_timeout(tern_factory, backend):
    t = served(tern_factory, backend, "--proxy-timeout", "200")
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="hold.x") == {"error": "proxy timeout",
                                                           "op": "subscribe"}
    assert 'tern_proxy_errors_total{kind="subscribe",reason="timeout"} 1' in metrics(t)


def test_backend_down(tern_factory):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    t = tern_factory("--proxy-subscribe", f"http://127.0.0.1:{port}/subscribe", "--feed", "off",
                     open_topics=False)
    lines = t.lines()
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="a") == {"error": "proxy unavailable",
                                                      "op": "subscribe"}
        # The connection goes on: ops that need no backend still work.
        assert ask(ws, op="limits")["ok"] == "limits"
    lines.wait(r"the subscribe proxy .*: .*")


def test_close_while_in_flight(tern_factory, backend):
    t = served(tern_factory, backend)
    with connect(ws_url(t)) as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "hold.gone"}))
        wait_for(lambda: backend.held == 1, "the backend to hold the request")
    # The client is gone; the answer comes after: nothing may touch it
    # (the sanitized build checks at stop).
    backend.release()
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="ok.after")["ok"] == "subscribe"
    assert t.stop() == 0


def test_in_flight_limit(tern_factory, backend):
    t = served(tern_factory, backend, "--proxy-max-inflight", "2")
    with connect(ws_url(t)) as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "hold.a"}))
        ws.send(json.dumps({"op": "subscribe", "topic": "hold.b"}))
        wait_for(lambda: backend.held == 2, "the backend to hold two requests")
        assert ask(ws, op="subscribe", topic="ok.c") == {"error": "proxy busy", "op": "subscribe"}
        backend.release()
        got = sorted(json.loads(ws.recv(timeout=5 * SLOW))["topic"] for _ in range(2))
        assert got == ["hold.a", "hold.b"]
        assert ask(ws, op="subscribe", topic="ok.c")["ok"] == "subscribe"
    assert 'tern_proxy_errors_total{kind="subscribe",reason="busy"} 1' in metrics(t)


def test_off_by_default(tern_factory):
    t = tern_factory("--feed", "off", open_topics=False)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="ok.room")["error"] == "forbidden"
    assert "tern_proxy_" not in metrics(t)


def test_connect_gives_user_and_info_to_presence(tern_factory, backend):
    t = tern_factory("--proxy-connect", backend.url("/connect/alice"), "--feed", "off",
                     "--topic", "room.* subscribe=anyone presence=on", open_topics=False)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="room.1")["ok"] == "subscribe"
        got = ask(ws, op="presence", topic="room.1")
        assert [(p["user"], p.get("info")) for p in got["presence"]] == [
            ("alice", {"name": "Alice"})]
    assert backend.requests[0] == ("/connect/alice",
                                   {"transport": "websocket", "protocol": "json", "user": ""})


def test_sse_connect_gives_user_and_info_to_presence(tern_factory, backend):
    # An /sse stream is in presence with the user and info the backend gave.
    t = tern_factory("--proxy-connect", backend.url("/connect/alice"), "--feed", "off",
                     "--topic", "room.* subscribe=anyone presence=on", open_topics=False)
    s = SSE(t.port, "topic=room.1")
    assert s.status == 200 and s.next()["event"] == "subscribed"
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="room.1")["ok"] == "subscribe"
        got = ask(ws, op="presence", topic="room.1")
        assert [(p["user"], p.get("info")) for p in got["presence"]] == [
            ("alice", {"name": "Alice"})] * 2
    s.close()


def test_connect_refused_or_unanswered_closes(tern_factory, backend):
    t = tern_factory("--proxy-connect", backend.url("/connect/deny"), "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        with pytest.raises(Exception):
            ws.recv(timeout=5 * SLOW)
        assert (ws.close_code, ws.close_reason) == (4403, "go away")
    t = tern_factory("--proxy-connect", backend.url("/connect/hold"), "--proxy-timeout", "200",
                     "--feed", "off", open_topics=False)
    with connect(ws_url(t)) as ws:
        with pytest.raises(Exception):
            ws.recv(timeout=5 * SLOW)
        assert (ws.close_code, ws.close_reason) == (1013, "proxy timeout")


def test_connect_waits_for_the_answer(tern_factory, backend):
    t = tern_factory("--proxy-connect", backend.url("/connect/hold"), "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        # Sent before the backend answers: read only once it has.
        ws.send(json.dumps({"op": "limits"}))
        wait_for(lambda: backend.held == 1, "the backend to hold the connect")
        backend.release()
        assert json.loads(ws.recv(timeout=5 * SLOW))["ok"] == "limits"
    # A connection gone while its connect is held: nothing touches it.
    backend.release_event_reset()
    with connect(ws_url(t)) as ws:
        wait_for(lambda: backend.held == 2, "the backend to hold the second connect")
    backend.release()
    assert t.stop() == 0


def refreshes(backend):
    return [b for p, b in backend.requests if p.startswith("/refresh/")]


@pytest.mark.parametrize("refresh", [None, "expire"])
def test_expiry_without_refresh_or_refused_closes(tern_factory, backend, refresh):
    extra = ["--proxy-refresh", backend.url(f"/refresh/{refresh}")] if refresh else []
    t = tern_factory("--proxy-connect", backend.url("/connect/expiring"), *extra, "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="limits")["ok"] == "limits"   # let in
        with pytest.raises(Exception):
            ws.recv(timeout=10 * SLOW)
        assert (ws.close_code, ws.close_reason) == (4001, "expired")
    assert len(refreshes(backend)) == (1 if refresh else 0)
    if refresh:
        assert refreshes(backend)[0] == {"transport": "websocket", "protocol": "json",
                                         "user": "bob"}


def test_refresh_extends(tern_factory, backend):
    t = tern_factory("--proxy-connect", backend.url("/connect/expiring"),
                     "--proxy-refresh", backend.url("/refresh/extend"), "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        wait_for(lambda: len(refreshes(backend)) == 1, "the refresh at the expiry")
        # Still open, and not asked again: the new expiry is an hour away.
        assert ask(ws, op="limits")["ok"] == "limits"
        assert len(refreshes(backend)) == 1
    assert 'tern_proxy_requests_total{kind="refresh"} 1' in metrics(t)


def test_connect_gives_rights(tern_factory, backend):
    # No rule and no subscribe proxy: the rights decide, as a token's would.
    t = tern_factory("--proxy-connect", backend.url("/connect/rights"), "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="news.1")["ok"] == "subscribe"
        assert ask(ws, op="subscribe", topic="other.1")["error"] == "forbidden"
        assert ask(ws, op="publish", topic="news.other", data="x")["error"] == "forbidden"
        assert ask(ws, op="publish", topic="news.local", data="x")["ok"] == "publish"


def test_stop_while_in_flight(tern_factory, backend):
    # The loop ends with a request held and its client still connected:
    # the thread's end cancels it (the sanitized build checks).
    t = served(tern_factory, backend)
    with connect(ws_url(t)) as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "hold.stop"}))
        wait_for(lambda: backend.held == 1, "the backend to hold the request")
        assert t.stop() == 0


def test_every_thread_asks(tern_factory, backend):
    t = served(tern_factory, backend, "--threads", "2")
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(connect(ws_url(t))) for _ in range(8)]
        for i, ws in enumerate(clients):
            assert ask(ws, op="subscribe", topic=f"ok.{i}")["ok"] == "subscribe"


def test_presence_for_those_the_backend_let_subscribe(tern_factory, backend):
    t = served(tern_factory, backend, "--topic", "ok.* presence=on")
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="presence", topic="ok.room")["error"] == "forbidden"
        assert ask(ws, op="subscribe", topic="ok.room")["ok"] == "subscribe"
        assert ask(ws, op="presence_stats", topic="ok.room")["clients"] == 1


# ---- GET /sse: the same backend ---------------------------------------------


def inflight(t, kind):
    """tern_proxy_inflight{kind=...} on /metrics."""
    for f in text_string_to_metric_families(metrics(t)):
        if f.name == "tern_proxy_inflight":
            return [int(s.value) for s in f.samples if s.labels["kind"] == kind][0]
    raise AssertionError("no tern_proxy_inflight on /metrics")


def test_sse_connect_gives_user_and_rights(tern_factory, backend, tmp_path):
    # The backend's user opens its user topic, its rights the topics left
    # to tokens; the token's sub is the user it is asked about.
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    t = tern_factory("--proxy-connect", backend.url("/connect/alice"), "--feed", "off",
                     "--token-hmac-secret-file", str(secret),
                     "--topic", "dm:* subscribe=user", open_topics=False)
    s = SSE(t.port, "topic=dm:%23alice")
    assert s.status == 200
    assert s.next()["event"] == "subscribed"
    assert t.publish("dm:%23alice", "hi")["subscribers"] == 1
    assert json.loads(s.until(lambda e: e["event"] == "message", "the message")[-1]["data"])[
        "data"] == "hi"
    s.close()
    assert status_of(t, "topic=dm:%23bob") == (403, "forbidden\n")
    assert status_of(t, "topic=dm:%23alice&token=" + token(claims(subscribe=["x"])))[0] == 200
    connects = [b for p, b in backend.requests if p == "/connect/alice"]
    assert connects == [{"transport": "sse", "protocol": "json", "user": u}
                        for u in ("", "", "tester")]
    t = tern_factory("--proxy-connect", backend.url("/connect/rights"), "--feed", "off",
                     open_topics=False)
    assert status_of(t, "topic=news.1") == (200, "subscribed")
    assert status_of(t, "topic=news.1&topic=other.1") == (403, "forbidden\n")


def test_sse_connect_denied_or_unanswered(tern_factory, backend):
    # The rules alone would let these streams in.
    t = tern_factory("--proxy-connect", backend.url("/connect/deny"), "--feed", "off",
                     "--topic", "open.* subscribe=anyone", open_topics=False)
    assert status_of(t, "topic=open.a") == (403, "go away\n")
    t = tern_factory("--proxy-connect", backend.url("/connect/hold"), "--proxy-timeout", "200",
                     "--feed", "off", "--topic", "open.* subscribe=anyone", open_topics=False)
    assert status_of(t, "topic=open.a") == (503, "proxy timeout\n")
    assert inflight(t, "connect") == 0


def test_sse_backend_down(tern_factory):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    for flag in ("--proxy-connect", "--proxy-subscribe"):
        t = tern_factory(flag, f"http://127.0.0.1:{port}/x", "--feed", "off",
                         "--topic", "open.* subscribe=anyone", open_topics=False)
        # SSE's reader gives up after 10 s (times SLOW) without an answer.
        assert status_of(t, "topic=open.a") == (503, "proxy unavailable\n"), flag


def test_sse_subscribe_asks_each_topic_in_order(tern_factory, backend):
    t = served(tern_factory, backend)
    assert status_of(t, "topic=ok.a&topic=deny.b&topic=ok.c") == (403, "not yours\n")
    assert [b["channel"] for p, b in backend.requests] == ["ok.a", "deny.b"]   # none after
    assert status_of(t, "topic=ok.a&topic=oops.b") == (503, "proxy error\n")
    s = SSE(t.port, "topic=ok.a&topic=ok.b")
    assert s.status == 200
    assert [s.next()["event"] for _ in range(2)] == ["subscribed", "subscribed"]
    t.publish("ok.b", "flowing")
    got = s.until(lambda e: e["event"] == "message", "the message")[-1]
    assert json.loads(got["data"])["data"] == "flowing"
    s.close()
    assert [b["channel"] for p, b in backend.requests][-2:] == ["ok.a", "ok.b"]


@pytest.mark.parametrize("flag,path,query", [
    ("--proxy-connect", "/connect/hold", "topic=open.a"),
    ("--proxy-subscribe", "/subscribe", "topic=open.a&topic=hold.b"),
])
def test_sse_client_gone_while_the_backend_is_slow(tern_factory, backend, flag, path, query):
    t = tern_factory(flag, backend.url(path), "--feed", "off",
                     "--topic", "open.* subscribe=anyone", open_topics=False)
    kind = flag.split("-")[-1]
    with socket.create_connection(("127.0.0.1", t.port)) as c:
        c.sendall(f"GET /sse?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        wait_for(lambda: backend.held == 1, "the backend to hold the request")
        assert inflight(t, kind) == 1
    # The client's going cancels the request before the backend answers.
    wait_for(lambda: inflight(t, kind) == 0, "the request to be cancelled")
    backend.release()
    assert status_of(t, "topic=open.a")[0] == 200   # answered at once now
    assert inflight(t, kind) == 0
    assert t.stop() == 0   # nothing touched what was freed (the sanitized build checks)


@pytest.mark.parametrize("refresh", [None, "expire"])
def test_sse_expiry_ends_the_stream(tern_factory, backend, refresh):
    extra = ["--proxy-refresh", backend.url(f"/refresh/{refresh}")] if refresh else []
    t = tern_factory("--proxy-connect", backend.url("/connect/expiring"), *extra, "--feed", "off",
                     "--topic", "open.* subscribe=anyone", open_topics=False)
    s = SSE(t.port, "topic=open.a")
    assert s.status == 200
    ev = s.until(lambda e: e["event"] == "error", "the expiry", timeout=10)[-1]
    assert json.loads(ev["data"]) == {"error": "token expired"}
    assert s.next() is None and not s.cut   # ended as a response ends
    s.close()
    assert refreshes(backend) == ([{"transport": "sse", "protocol": "json", "user": "bob"}]
                                  if refresh else [])


def test_sse_refresh_extends(tern_factory, backend):
    t = tern_factory("--proxy-connect", backend.url("/connect/expiring"),
                     "--proxy-refresh", backend.url("/refresh/extend"), "--feed", "off",
                     "--topic", "open.* subscribe=anyone", open_topics=False)
    s = SSE(t.port, "topic=open.a")
    assert s.next()["event"] == "subscribed"
    wait_for(lambda: len(refreshes(backend)) == 1, "the refresh at the expiry")
    # Still streaming: the new expiry is an hour away.
    t.publish("open.a", "still here")
    got = s.until(lambda e: e["event"] != "subscribed", "the message")[-1]
    assert got["event"] == "message" and json.loads(got["data"])["data"] == "still here"
    s.close()


def test_each_transport_names_itself(tern_factory, backend):
    # The backend is told which transport asks, in its connect and its
    # subscribes: a /pubsub WebSocket "websocket", an /sse stream "sse",
    # an /http-stream session "http_stream" (whose relay is a /pubsub
    # session of the server's own, yet not a WebSocket client's).
    t = tern_factory("--proxy-connect", backend.url("/connect/alice"),
                     "--proxy-subscribe", backend.url("/subscribe"), "--feed", "off",
                     open_topics=False)
    with connect(ws_url(t)) as ws:
        assert ask(ws, op="subscribe", topic="ok.ws")["ok"] == "subscribe"
    s = SSE(t.port, "topic=ok.sse")
    assert s.status == 200 and s.next()["event"] == "subscribed"
    s.close()

    async def go():
        async with aiohttp.ClientSession() as http:
            st = await Stream(http, t.base).open()
            assert st.status == 200
            assert await st.send({"op": "subscribe", "topic": "ok.stream"}) == 202
            await st.until(lambda m: m.get("ok") == "subscribe", "the subscribe's ack")
            st.close()

    run(go())
    asked = [(p, b.get("channel"), b["transport"]) for p, b in backend.requests]
    assert asked == [("/connect/alice", None, "websocket"), ("/subscribe", "ok.ws", "websocket"),
                     ("/connect/alice", None, "sse"), ("/subscribe", "ok.sse", "sse"),
                     ("/connect/alice", None, "http_stream"),
                     ("/subscribe", "ok.stream", "http_stream")]
