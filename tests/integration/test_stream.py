"""tern serve's HTTP-streaming transport (src/app/serve_stream.c): GET
/http-stream carries /pubsub's server messages as lines of JSON, POST
/http-stream/ops?session=ID carries the client's ops; read by aiohttp.

Checked: the ops and their answers (subscribe, publish, messages,
unsubscribe, limits) in /pubsub's own JSON; a resume with no gap and no
duplicate through a proxy that cuts the stream again and again; two
threads, with the POSTs reaching either loop; a bad, unknown or ended
session (400, 404); the token's and the Origin's refusals (401, 403);
/pubsub's rate limit on the ops; a reader that stops reading is bounded
by /pubsub's slow-consumer policy; the token's expiry ends the stream; SIGTERM
ends the streams; headless Chromium's tern-client falls back to it by
itself when a proxy refuses WebSocket upgrades."""
import asyncio
import http.client
import json
import socket
import struct
import threading
import time

import aiohttp
import pytest

from conftest import SANITIZED, SLOW, wait_for
from test_sse import CuttingProxy
from test_tokens import SECRET, claims, token
from test_ws_clients import chromium, chromium_devtools  # noqa: F401 (fixture)

TIMEOUT = 10 * SLOW


class Stream:
    """One GET /http-stream: its session, then each line as JSON (an empty
    line, the keep-alive, is skipped)."""

    def __init__(self, http, base):
        self.http, self.base = http, base

    async def open(self, query="", headers=None):
        self.resp = await self.http.get(f"{self.base}/http-stream{query}", headers=headers or {})
        self.status = self.resp.status
        if self.status == 200:
            self.session = (await self.next())["session"]
        return self

    async def next(self, timeout=TIMEOUT):
        """The next value, or None at the stream's end."""
        while True:
            line = await asyncio.wait_for(self.resp.content.readline(), timeout)
            if not line:
                return None
            if line.strip():
                return json.loads(line)

    async def until(self, cond, what, timeout=TIMEOUT):
        seen = []
        while True:
            m = await self.next(timeout)
            assert m is not None, f"ended before {what}: {seen}"
            seen.append(m)
            if cond(m):
                return seen

    async def send(self, *ops, session=None):
        body = "\n".join(json.dumps(op) for op in ops)
        async with self.http.post(f"{self.base}/http-stream/ops?session={session or self.session}",
                                  data=body) as r:
            return r.status

    def close(self):
        self.resp.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60 * SLOW))


def test_ops_and_answers_in_the_pubsub_json(tern_factory):
    t = tern_factory("--feed", "off", "--topic", "h history=10")

    async def go():
        async with aiohttp.ClientSession() as http:
            s = await Stream(http, t.base).open()
            assert s.status == 200
            assert s.resp.headers["Content-Type"] == "application/x-ndjson"
            assert len(s.session) == 32
            # several ops in one POST, answered in order on the stream
            assert await s.send({"op": "limits"}, {"op": "subscribe", "topic": "h"}) == 202
            limits, ack = await s.next(), await s.next()
            assert limits["ok"] == "limits" and "rate" in limits
            assert ack["ok"] == "subscribe" and ack["topic"] == "h" and ack["seq"] == 0
            assert await s.send({"op": "publish", "topic": "h", "data": "hi"}) == 202
            got = [await s.next(), await s.next()]   # the message, the ack: either order
            assert {"ok": "publish", "topic": "h", "seq": 1} in got
            assert {"topic": "h", "seq": 1, "data": "hi"} in got
            t.publish("h", "from the api")
            assert (await s.next())["data"] == "from the api"
            assert await s.send({"op": "unsubscribe", "topic": "h"}) == 202
            assert await s.next() == {"ok": "unsubscribe", "topic": "h"}
            assert await s.send({"op": "nonsense"}) == 202
            assert "error" in await s.next()
            # a resume by the ack's epoch and the last seq: what was missed
            t.publish("h", "missed")
            assert await s.send({"op": "subscribe", "topic": "h", "epoch": ack["epoch"],
                                 "after": "2"}) == 202
            got = await s.until(lambda m: m.get("ok") == "subscribe", "the resume's ack")
            assert got[0]["data"] == "missed" and got[-1]["resumed"] is True
            s.close()

    run(go())


def test_bad_unknown_and_ended_sessions(tern_factory):
    t = tern_factory("--feed", "off")

    async def go():
        async with aiohttp.ClientSession() as http:
            s = await Stream(http, t.base).open()
            assert await s.send({"op": "limits"}, session="nothex") == 400
            assert await s.send({"op": "limits"}, session="0" * 31) == 400
            assert await s.send({"op": "limits"}, session="0" * 32) == 404
            assert await s.send({"op": "limits"}) == 202
            assert (await s.next())["ok"] == "limits"
            sid = s.session
            s.close()
            # the stream gone, its session with it (the abort is seen at
            # once: the client closed its connection)
            for _ in range(int(100 * SLOW)):
                if await s.send({"op": "limits"}, session=sid) == 404:
                    break
                await asyncio.sleep(0.05)
            assert await s.send({"op": "limits"}, session=sid) == 404

    run(go())


@pytest.fixture
def guarded(tern_factory, tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    return tern_factory("--token-hmac-secret-file", str(f), "--token-leeway", "0", "--feed", "off",
                        "--topic", "open.* subscribe=anyone", "--allowed-origin",
                        "https://app.example", open_topics=False)


def test_the_tokens_and_origins_refusals_are_pubsubs(guarded):
    t = guarded
    good = token(claims(subscribe=["team.*"]))

    async def go():
        async with aiohttp.ClientSession() as http:
            assert (await Stream(http, t.base).open("?token=not.a.token")).status == 401
            bad = token(claims(subscribe=["*"]), secret=b"another")
            assert (await Stream(http, t.base).open(
                headers={"Authorization": f"Bearer {bad}"})).status == 401
            assert (await Stream(http, t.base).open(
                headers={"Origin": "https://evil.example"})).status == 403
            async with http.post(f"{t.base}/http-stream/ops?session={'0' * 32}", data="{}",
                                 headers={"Origin": "https://evil.example"}) as r:
                assert r.status == 403
            # the token's rights, by query and by header
            for q, h in ((f"?token={good}", None), ("", {"Authorization": f"Bearer {good}"})):
                s = await Stream(http, t.base).open(q, h)
                assert s.status == 200
                await s.send({"op": "subscribe", "topic": "team.a"},
                             {"op": "subscribe", "topic": "other"})
                assert (await s.next())["ok"] == "subscribe"
                assert (await s.next())["error"] == "forbidden"
                s.close()
            # anonymous: the rule's topic only
            s = await Stream(http, t.base).open(headers={"Origin": "https://app.example"})
            await s.send({"op": "subscribe", "topic": "team.a"},
                         {"op": "subscribe", "topic": "open.a"})
            assert (await s.next())["error"] == "forbidden"
            assert (await s.next())["ok"] == "subscribe"
            s.close()

    run(go())


def test_the_stream_ends_at_the_tokens_expiry(guarded):
    t = guarded

    async def go():
        async with aiohttp.ClientSession() as http:
            s = await Stream(http, t.base).open("?token=" + token(claims(ttl=2)))
            assert s.status == 200
            last = (await s.until(lambda m: "close" in m, "the expiry"))[-1]
            assert last["close"] == 4001 and "expired" in last["reason"]
            assert await s.next() is None   # the response's end
            s.close()

    run(go())


def test_the_rate_limit_applies_to_the_ops(tern_factory):
    t = tern_factory("--feed", "off", "--pubsub-rate", "5")

    async def go():
        async with aiohttp.ClientSession() as http:
            s = await Stream(http, t.base).open()
            ops = [{"op": "publish", "topic": "r", "data": str(i)} for i in range(20)]
            assert await s.send(*ops) == 202
            got = await s.until(lambda m: m.get("error") == "rate limit", "a refusal")
            assert len([m for m in got if m.get("ok") == "publish"]) <= 5
            s.close()

    run(go())


@pytest.mark.parametrize("threads", ["1", "2"])
def test_resume_through_a_proxy_that_cuts_no_gap_no_duplicate(tern_factory, threads):
    """The client resumes each new stream where the last one's messages
    stopped ({"op":"subscribe",...,"epoch","after"}); the POSTs go around
    the proxy, straight to the server, so with two threads they reach
    either loop and are forwarded to the stream's."""
    t = tern_factory("--feed", "off", "--threads", threads, "--topic", "r.* history=5000")
    proxy = CuttingProxy(t.port, seed=41, budget=(200, 2000))
    n = 300
    got = {"r.a": [], "r.b": []}
    epoch = {}

    async def read(subscribed):
        async with aiohttp.ClientSession() as http:
            while min(len(v) for v in got.values()) < n:
                s = Stream(http, f"http://127.0.0.1:{proxy.port}")
                try:
                    await s.open()
                    ops = []
                    for topic in got:
                        op = {"op": "subscribe", "topic": topic}
                        if topic in epoch:
                            op.update(epoch=epoch[topic], after=str(got[topic][-1]
                                                                     if got[topic] else 0))
                        ops.append(op)
                    async with http.post(f"{t.base}/http-stream/ops?session={s.session}",
                                         data="\n".join(map(json.dumps, ops))) as r:
                        assert r.status in (202, 404)   # 404: cut and gone already
                    while min(len(v) for v in got.values()) < n:
                        m = await s.next()
                        if m is None:
                            break
                        if m.get("ok") == "subscribe":
                            assert m.get("resumed", True), m   # never a gap
                            epoch[m["topic"]] = m["epoch"]
                            if len(epoch) == 2:
                                subscribed.set()
                        elif "seq" in m and "data" in m:
                            got[m["topic"]].append(m["seq"])
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError,
                        aiohttp.ServerDisconnectedError, json.JSONDecodeError, KeyError):
                    pass   # cut: in the head, or mid-line
                finally:
                    if hasattr(s, "resp"):
                        s.close()

    async def go():
        subscribed = asyncio.Event()
        reader = asyncio.create_task(read(subscribed))
        await asyncio.wait_for(subscribed.wait(), 30 * SLOW)
        for i in range(n):
            await asyncio.to_thread(t.publish, "r.a", f"a{i}")
            await asyncio.to_thread(t.publish, "r.b", f"b{i}")
        await asyncio.wait_for(reader, 60 * SLOW)

    asyncio.run(go())
    proxy.close()
    assert proxy.cuts >= 10
    for topic, seqs in got.items():
        assert seqs == list(range(1, n + 1)), (topic, seqs)


def test_two_threads_each_posts_ops_reach_their_stream(tern_factory):
    t = tern_factory("--feed", "off", "--threads", "2")

    async def go():
        async with aiohttp.ClientSession() as http:
            streams = [await Stream(http, t.base).open() for _ in range(8)]
            for i, s in enumerate(streams):
                # a fresh connection per POST: the kernel spreads them over
                # both threads' listeners
                async with aiohttp.ClientSession() as other:
                    async with other.post(f"{t.base}/http-stream/ops?session={s.session}",
                                          data=json.dumps({"op": "subscribe",
                                                           "topic": f"t{i}"})) as r:
                        assert r.status == 202
            for i, s in enumerate(streams):
                assert (await s.next())["topic"] == f"t{i}"
            t.publish("t3", "x")
            assert (await streams[3].next())["data"] == "x"
            for s in streams:
                s.close()

    run(go())


def test_sigterm_ends_the_streams(tern_factory):
    t = tern_factory("--feed", "off")

    async def go():
        async with aiohttp.ClientSession() as http:
            s = await Stream(http, t.base).open()
            await s.send({"op": "subscribe", "topic": "x"})
            assert (await s.next())["ok"] == "subscribe"
            stopping = asyncio.create_task(asyncio.to_thread(t.stop))
            last = (await s.until(lambda m: "close" in m, "the close"))[-1]
            assert last["close"] == 1001
            s.close()
            assert await stopping == 0

    run(go())


def test_a_stream_whose_reader_stalled_then_went_leaves_no_relay_behind(tern_factory):
    """A reader that stops reading pauses its stream's relay; when it then
    goes, the relay must still read /pubsub's answer to its close, and a
    SIGTERM drops what relays are left: the server exits 0 at once (not at
    the shutdown's deadline), frees its loop ("not freed" is logged
    otherwise) and, under the sanitizers, leaks nothing."""
    t = tern_factory("--feed", "off", "--pubsub-max-backlog", "65536", "--topic", "stall policy=drop")
    c, r, h = small_window_stream(t, "stall")
    big = "x" * 16000
    for _ in range(400):   # 6.4 MB the reader never reads: the relay pauses
        t.publish("stall", big)
    # the relay paused: its session's backlog in /pubsub passed its limit
    wait_for(lambda: t.stats()["total"]["pubsub"]["dropped"] > 0, "drops in /pubsub")
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()   # the reader goes (a reset: nothing more to read)
    h.close()
    started = time.monotonic()
    assert t.stop() == 0
    assert time.monotonic() - started < 5 * SLOW, "the shutdown waited for its deadline"
    assert "not freed" not in t.stderr, t.stderr


def test_the_relays_count_against_no_per_address_limit(tern_factory):
    """Each stream's /pubsub session comes over the server's private Unix
    socket, not from 127.0.0.1: more streams than --max-connections-per-ip
    allows one address only count their own connections."""
    t = tern_factory("--feed", "off", "--max-connections-per-ip", "4")

    async def go():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            streams = [await Stream(http, t.base).open() for _ in range(3)]
            assert [s.status for s in streams] == [200] * 3
            for s in streams:
                assert await s.send({"op": "limits"}) == 202
                assert (await s.next())["ok"] == "limits"
                s.close()

    run(go())


class SmallWindow(http.client.HTTPConnection):
    """An HTTP connection with a small receive buffer: a reader that stops
    reading holds the server back at once, as a slow link does."""

    def connect(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(30 * SLOW)
        self.sock.connect((self.host, self.port))


def small_window_stream(t, topic):
    """A stream read through a SmallWindow, subscribed to topic: the
    connection, its response (the session and the ack read), and the
    connection the subscribe was POSTed on."""
    c = SmallWindow("127.0.0.1", t.port)
    c.request("GET", "/http-stream")
    r = c.getresponse()
    assert r.status == 200
    session = json.loads(r.readline())["session"]
    h = http.client.HTTPConnection("127.0.0.1", t.port, timeout=10 * SLOW)
    h.request("POST", f"/http-stream/ops?session={session}",
              body=json.dumps({"op": "subscribe", "topic": topic}))
    assert h.getresponse().status == 202
    assert json.loads(r.readline())["ok"] == "subscribe"
    return c, r, h


@pytest.mark.parametrize("policy", ["drop", "close"])
def test_a_reader_that_stops_reading_is_bounded(tern_factory, policy):
    """The stream's relay stops reading while its client is behind, so the
    backlog grows in /pubsub, whose limit and policy judge it as they would
    a slow WebSocket client: messages dropped, or the session closed (1008,
    the stream's last line once the reader reads again)."""
    t = tern_factory("--feed", "off", "--pubsub-max-backlog", "65536",
                     "--topic", f"slow policy={policy}")
    c, r, h = small_window_stream(t, "slow")
    rss = t.rss_kib()
    big = "x" * 16000
    for _ in range(400):   # 6.4 MB, a hundred times the limit
        t.publish("slow", big)
    pubsub = lambda: t.stats()["total"]["pubsub"]   # noqa: E731
    if policy == "drop":
        wait_for(lambda: pubsub()["dropped"] > 0, "drops")
    else:
        wait_for(lambda: pubsub()["closed"] == 1, "the close")
    if not SANITIZED:   # the sanitizers hold freed memory back
        assert t.rss_kib() - rss < 8 * 1024   # far under what was published
    seqs, last = [], []

    def read():
        while True:
            line = r.readline()
            if not line:
                return
            if not line.strip():
                continue
            m = json.loads(line)
            last[:] = [m]
            if "close" in m:
                return
            seqs.append(m["seq"])
            if m["data"] == "end":
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if policy == "drop":
        for _ in range(50):   # once the reader has caught up, one gets through
            t.publish("slow", "end")
            try:
                wait_for(lambda: not reader.is_alive(), "the end", timeout=1)
                break
            except AssertionError:
                pass
    reader.join(30 * SLOW)
    assert not reader.is_alive()
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len([q for q in seqs if q <= 400]) < 400
    if policy == "close":
        assert last[0]["close"] == 1008, last
    c.close()
    h.close()


class NoUpgradeProxy:
    """A proxy to port that answers every WebSocket upgrade 403, as a
    company proxy that blocks WebSockets does, and passes the rest on."""

    def __init__(self, port):
        self.port_to = port
        self.refused = 0
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while (data := a.recv(65536)):
                b.sendall(data)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _serve(self, c):
        head = b""
        while b"\r\n\r\n" not in head:
            b = c.recv(65536)
            if not b:
                c.close()
                return
            head += b
        if b"upgrade: websocket" in head.lower():
            self.refused += 1
            c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            c.close()
            return
        u = socket.create_connection(("127.0.0.1", self.port_to))
        u.sendall(head)
        threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()
        self._pipe(c, u)

    def close(self):
        self.lsock.close()


FALLBACK_JS = """
window.__got = []; window.__transports = []; window.__ready = false;
import('/tern-client.js').then(({TernClient}) => {
  const c = new TernClient('ws://' + location.host + '/pubsub', {backoffInitial: 50});
  window.__c = c;
  c.on('transport', t => window.__transports.push(t));
  const s = c.subscribe('b.a', m => window.__got.push(m.data));
  s.ready.then(() => { window.__ready = true; });
});
'ok'
"""


def test_chromium_tern_client_falls_back_when_websockets_are_refused(tern_factory, chromium,  # noqa: F811
                                                                     tmp_path):
    """Headless Chromium loads tern-client from the server through a proxy
    that refuses WebSocket upgrades: after its WebSocket attempts fail,
    the client uses /http-stream (fetch streaming) by itself, says so, and
    subscribes, receives and publishes as over /pubsub."""
    t = tern_factory("--feed", "off")
    proxy = NoUpgradeProxy(t.port)
    with chromium_devtools(chromium, tmp_path) as dt:
        try:
            target, s = dt.open_page()
            # The page's origin is the proxy's: tern-client comes from it,
            # and so do its WebSocket attempts and its streams.
            nav = dt.call("Page.navigate", {"url": f"http://127.0.0.1:{proxy.port}/ping"},
                          session=s)
            assert "errorText" not in nav, nav
            dt.wait_event(lambda e: e.get("method") == "Page.loadEventFired")

            def js(expr):
                r = dt.call("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                            session=s)
                assert "exceptionDetails" not in r, r
                return r["result"]["value"]

            assert js(FALLBACK_JS) == "ok"
            wait_for(lambda: js("window.__ready"), "the subscription", timeout=20)
            assert js("window.__c.transport") == "http-stream"
            assert js("window.__transports") == ["http-stream"]
            assert proxy.refused >= 2
            t.publish("b.a", "to the browser")
            js("window.__c.publish('b.a', 'from the browser')")
            wait_for(lambda: js("window.__got.length") >= 2, "both messages", timeout=20)
            assert js("window.__got") == ["to the browser", "from the browser"]
            dt.call("Target.closeTarget", {"targetId": target})
        finally:
            proxy.close()
