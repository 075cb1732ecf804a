"""tern serve's GET /sse (src/app/serve_sse.c): /pubsub's topics as
Server-Sent Events, read by an SSE reader of our own over plain sockets
(HTTP/1.1, chunked), and by headless Chromium's EventSource.

Checked: the refusals (401 for a bad token, 403 for a topic the rules or
the token's rights refuse, 400 for no topic or a bad one, 403 for an Origin
not allowed); a snapshot then the live stream; a resume by Last-Event-ID
through a proxy that cuts every connection after a few hundred bytes, on
two topics at once, with no gap and no duplicate; a gap said when the id is
not the stream's; a reader that stops reading is bounded by the pub/sub
limit and policy (dropped, or its stream ended); SIGTERM ends the streams
at once."""
import json
import random
import socket
import threading
import time

import pytest
from websockets.sync.client import connect

from conftest import SANITIZED, SLOW, read_response, wait_for
from test_tokens import SECRET, claims, token
from test_ws_clients import chromium, chromium_devtools  # noqa: F401 (fixture)


class SSE:
    """One GET /sse over a socket: the response's status and headers, then
    its events as EventSource parses them (a field per line; an event is
    dispatched at its blank line; the last event ID is only moved by a
    dispatched event, so an event cut in the middle is lost whole, and
    its id with it)."""

    def __init__(self, port, query, headers=None, host="127.0.0.1", rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(0.5)
        self.sock.connect((host, port))
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(f"GET /sse?{query} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
        self.raw = b""      # received, not yet decoded from chunks
        self.text = ""      # decoded, not yet parsed into events
        self.ended = False  # the last chunk came, or the connection closed
        self.cut = False    # closed without the last chunk
        self.last_id = ""
        self.comments = 0
        self._event = {}
        head = self._read_until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip()
                        for k, _, v in (l.partition(":") for l in lines[1:])}

    def _recv(self):
        """More bytes (b"" at the end: then ended and cut), or None when
        none came within the socket's timeout."""
        try:
            b = self.sock.recv(65536)
        except socket.timeout:
            return None
        except ConnectionResetError:
            b = b""
        if not b:
            self.ended = self.cut = True
        self.raw += b
        return b

    def _read_until(self, sep):
        deadline = time.monotonic() + 10 * SLOW
        while sep not in self.raw:
            if self._recv() == b"" or time.monotonic() > deadline:
                raise EOFError(f"closed before {sep!r}: {self.raw!r}")
        out, _, self.raw = self.raw.partition(sep)
        return out

    def body(self):
        """A refusal's body (Content-Length)."""
        n = int(self.headers.get("content-length", "0"))
        while len(self.raw) < n and self._recv() != b"":
            pass
        return self.raw[:n].decode()

    def _dechunk(self):
        while not self.ended and b"\r\n" in self.raw:
            size_line, _, rest = self.raw.partition(b"\r\n")
            size = int(size_line, 16)
            if len(rest) < size + 2:
                return
            self.text += rest[:size].decode()
            self.raw = rest[size + 2:]
            if size == 0:
                self.ended = True

    def next(self, timeout=5.0):
        """The next dispatched event ({"event", "data", "id"}), or None when
        the stream ended first."""
        deadline = time.monotonic() + timeout * SLOW
        while True:
            while "\n" in self.text:
                line, _, self.text = self.text.partition("\n")
                if line == "":
                    if "data" in self._event:
                        ev = self._event
                        ev.setdefault("event", "message")
                        ev["id"] = self.last_id = ev.get("id", self.last_id)
                        self._event = {}
                        return ev
                    self._event = {}
                    continue
                if line.startswith(":"):
                    self.comments += 1
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    self._event["data"] = self._event["data"] + "\n" + value \
                        if "data" in self._event else value
                elif name in ("event", "id", "retry"):
                    self._event[name] = value
                    if name == "retry":
                        self.retry = int(value)
            self._dechunk()
            if "\n" in self.text:
                continue
            if self.ended:
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"no event within {timeout} s: {self.text!r}")
            self._recv()

    def until(self, cond, what, timeout=10.0):
        """Events up to and including the first for which cond holds."""
        got = []
        while True:
            ev = self.next(timeout)
            assert ev is not None, f"the stream ended before {what}: {got}"
            got.append(ev)
            if cond(ev):
                return got

    def close(self):
        self.sock.close()


def messages(events):
    return [json.loads(e["data"]) for e in events if e["event"] == "message"]


def ws_publish(t, topic, data, key=None):
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        msg = {"op": "publish", "topic": topic, "data": data}
        if key:
            msg["key"] = key
        ws.send(json.dumps(msg))
        assert json.loads(ws.recv(timeout=5 * SLOW))["ok"] == "publish"


# ---- refusals -----------------------------------------------------------


@pytest.fixture
def guarded(tern_factory, tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    return tern_factory("--token-hmac-secret-file", str(f), "--token-leeway", "0", "--feed", "off",
                        "--topic", "open.* subscribe=anyone", "--topic", "shut subscribe=none",
                        "--allowed-origin", "https://app.example", open_topics=False)


def status_of(t, query, headers=None):
    s = SSE(t.port, query, headers)
    try:
        return s.status, (s.body() if s.status != 200 else s.next()["event"])
    finally:
        s.close()


def test_refusals_follow_the_pubsub_rules(guarded):
    t = guarded
    good = token(claims(subscribe=["team.*"]))
    assert status_of(t, "topic=open.a")[0] == 200                    # the rule opens it
    assert status_of(t, "topic=team.a") == (403, "forbidden\n")       # anonymous: no rights
    assert status_of(t, f"topic=team.a&token={good}")[0] == 200       # the token's rights
    assert status_of(t, "topic=team.a", {"Authorization": f"Bearer {good}"})[0] == 200
    assert status_of(t, "topic=other&token=" + good) == (403, "forbidden\n")
    assert status_of(t, f"topic=open.a&topic=other&token={good}")[0] == 403   # one refused: all
    assert status_of(t, "topic=shut&token=" + good)[0] == 403         # subscribe=none
    assert status_of(t, "topic=open.a&token=not.a.token") == (401, "bad token\n")
    bad_sig = token(claims(subscribe=["*"]), secret=b"another")
    assert status_of(t, "topic=open.a", {"Authorization": f"Bearer {bad_sig}"})[0] == 401
    assert status_of(t, "") == (400, "no topic\n")
    assert status_of(t, "topic=") == (400, "bad topic\n")
    assert status_of(t, "topic=a%00b")[0] == 400
    assert status_of(t, "topic=" + "x" * 257)[0] == 400
    assert status_of(t, "topic=open.a&topic=open.a")[0] == 400
    assert status_of(t, "&".join(f"topic=open.{i}" for i in range(65)))[0] == 400
    assert status_of(t, "topic=open.a", {"Origin": "https://evil.example"})[0] == 403
    assert status_of(t, "topic=open.a", {"Origin": "https://app.example"})[0] == 200
    # HEAD: the same answers, and no stream left pending: the next request
    # on the connection is answered.
    with socket.create_connection(("127.0.0.1", t.port)) as c:
        c.sendall(b"HEAD /sse?topic=open.a HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"HEAD /sse?topic=team.a HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _, rest = read_response(c, for_head=True)
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert (rest.startswith(b"HTTP/1.1 403") if rest
                else read_response(c, for_head=True)[0] == 403)


def test_stream_ends_at_the_tokens_expiry(guarded):
    t = guarded
    s = SSE(t.port, "topic=team.a&token=" + token(claims(ttl=2, subscribe=["team.*"])))
    assert s.status == 200
    s.until(lambda e: e["event"] == "subscribed", "the ack")
    ev = s.until(lambda e: e["event"] == "error", "the expiry", timeout=10)[-1]
    assert json.loads(ev["data"]) == {"error": "token expired"}
    assert s.next() is None and not s.cut   # ended as a response ends: the last chunk
    s.close()


# ---- snapshot, live, resume ----------------------------------------------


def test_snapshot_then_live(tern_factory):
    t = tern_factory("--feed", "off", "--topic", "snap history=100")
    for k, v in (("k1", "a"), ("k2", "b"), ("k1", "c")):
        ws_publish(t, "snap", v, key=k)
    s = SSE(t.port, "topic=snap&snapshot=1")
    assert s.status == 200
    assert s.headers["content-type"] == "text/event-stream"
    assert s.headers["cache-control"] == "no-store"
    got = s.until(lambda e: e["event"] == "subscribed", "the ack")
    assert s.retry == 2000
    assert messages(got) == []   # the snapshot follows the ack
    ack = json.loads(got[-1]["data"])
    assert ack["snapshot"] == 2 and ack["seq"] == 3 and ack["topic"] == "snap"
    assert got[-1]["id"] == f"{int(ack['epoch'], 16):x}.0"   # nothing of the epoch sent yet
    got = s.until(lambda e: e["event"] == "message" and json.loads(e["data"])["seq"] == 3,
                  "the snapshot")
    assert [(m["key"], m["data"], m["seq"]) for m in messages(got)] == [("k2", "b", 2),
                                                                       ("k1", "c", 3)]
    assert got[-1]["id"] == f"{int(ack['epoch'], 16):x}.3"
    t.publish("snap", "live")
    ev = s.next()
    assert json.loads(ev["data"]) == {"topic": "snap", "seq": 4, "data": "live"}
    assert ev["id"] == f"{int(ack['epoch'], 16):x}.4"
    s.close()


def test_streams_of_one_and_of_two_topics_each_get_their_own_ids(tern_factory):
    """A message goes to every stream of its topic; the one-topic streams'
    events are alike (the server formats one for all), a two-topic
    stream's id names both topics' positions, and a stream that joined
    later gets the same events from its start. The same data on two
    topics makes two different events."""
    t = tern_factory("--feed", "off", "--topic", "m.* history=100")
    ones = [SSE(t.port, "topic=m.a") for _ in range(3)]
    both = SSE(t.port, "topic=m.a&topic=m.b")
    only_b = SSE(t.port, "topic=m.b")
    epoch = {}
    for s in ones + [only_b]:
        ack = json.loads(s.until(lambda e: e["event"] == "subscribed", "the ack")[-1]["data"])
        epoch[ack["topic"]] = int(ack["epoch"], 16)
    both.until(lambda e: e["event"] == "subscribed" and "m.b" in e["data"], "both acks")
    for i in range(1, 4):
        t.publish("m.a", f"same {i}")
        t.publish("m.b", f"same {i}")
    late = SSE(t.port, "topic=m.a")
    late.until(lambda e: e["event"] == "subscribed", "the late ack")
    t.publish("m.a", "same 4")
    t.publish("m.b", "same 4")
    ea, eb = f"{epoch['m.a']:x}", f"{epoch['m.b']:x}"
    want_a = [({"topic": "m.a", "seq": i, "data": f"same {i}"}, f"{ea}.{i}") for i in range(1, 5)]
    for s in ones:
        got = s.until(lambda e: e["event"] == "message" and '"seq":4' in e["data"], "seq 4")
        assert [(json.loads(e["data"]), e["id"]) for e in got] == want_a
    got = only_b.until(lambda e: e["event"] == "message" and '"seq":4' in e["data"], "seq 4")
    assert [(json.loads(e["data"]), e["id"]) for e in got] == [
        ({"topic": "m.b", "seq": i, "data": f"same {i}"}, f"{eb}.{i}") for i in range(1, 5)]
    got = late.until(lambda e: e["event"] == "message", "seq 4")
    assert [(json.loads(e["data"]), e["id"]) for e in got] == want_a[3:]
    got = both.until(lambda e: e["event"] == "message" and '"m.b","seq":4' in e["data"], "b 4")
    assert [e["id"] for e in got] == [f"{ea}.1,{eb}.0", f"{ea}.1,{eb}.1", f"{ea}.2,{eb}.1",
                                      f"{ea}.2,{eb}.2", f"{ea}.3,{eb}.2", f"{ea}.3,{eb}.3",
                                      f"{ea}.4,{eb}.3", f"{ea}.4,{eb}.4"]
    for s in ones + [both, only_b, late]:
        s.close()


def test_a_foreign_last_event_id_is_a_gap(tern_factory):
    t = tern_factory("--feed", "off", "--topic", "g.* history=100")
    ws_publish(t, "g.a", "one", key="k")
    ws_publish(t, "g.a", "two", key="k")
    for last in ("1234.1", "nonsense", "1.1,2.2"):   # another epoch; not an id; two topics
        s = SSE(t.port, "topic=g.a", {"Last-Event-ID": last})
        got = s.until(lambda e: e["event"] == "message", "the latest of the key")
        assert [e["event"] for e in got] == ["gap", "subscribed", "message"], (last, got)
        assert json.loads(got[0]["data"])["seq"] == 2
        assert messages(got)[0]["data"] == "two"   # the latest of the key
        assert json.loads(got[1]["data"])["resumed"] is False
        s.close()


def test_other_texts_line_by_line_binary_not_at_all(tern):
    """Topic fanout's raw messages (/fanout/pub, --bench-routes): a text
    with line breaks goes as one "data:" line each, which EventSource joins
    with LF; without /pubsub's format it has no id; a binary message is not
    sent (SSE is text)."""
    s = SSE(tern.port, "topic=fanout")
    s.until(lambda e: e["event"] == "subscribed", "the ack")
    with connect(f"ws://127.0.0.1:{tern.port}/fanout/pub") as ws:
        ws.send(b"\x00\x01binary")
        ws.send("one\ntwo\r\nthree\rfour")
        ws.send("last")
    got = s.until(lambda e: e["data"] == "last", "the last")
    assert [e["data"] for e in got] == ["one\ntwo\nthree\nfour", "last"]
    ack_id = s.last_id
    assert all(e["id"] == ack_id for e in got)   # no id of their own: the ack's stays
    s.close()


def test_a_paced_replay_moves_the_id_as_it_goes_out(tern_factory):
    """A resume's replay follows the ack (--pubsub-replay-rate paces most of
    it): the ack's id stays where the stream is (the client's own point),
    not at the topic's seq, and each message moves it, so that a cut
    before the rest has come resumes from there, with no gap."""
    t = tern_factory("--feed", "off", "--topic", "p history=1000",
                     "--pubsub-replay-rate", "200000")
    s = SSE(t.port, "topic=p")
    epoch = json.loads(s.until(lambda e: e["event"] == "subscribed", "the ack")[-1]["data"])["epoch"]
    s.close()
    for i in range(100):
        t.publish("p", f"{i:02}" + "x" * 2000)
    e = f"{int(epoch, 16):x}"
    s = SSE(t.port, "topic=p", {"Last-Event-ID": f"{e}.0"})
    got = s.until(lambda ev: ev["event"] == "subscribed", "the ack")
    ack = json.loads(got[-1]["data"])
    assert ack["resumed"] is True and ack["replayed"] == 100 and ack["seq"] == 100
    assert messages(got) == [] and got[-1]["id"] == f"{e}.0"
    got = s.until(lambda ev: ev["event"] == "message" and json.loads(ev["data"])["seq"] == 10,
                  "part of the replay")
    first = [m["seq"] for m in messages(got)]
    assert first == list(range(1, 11)) and got[-1]["id"] == f"{e}.10"
    s.close()   # cut there: the next stream goes on from the last id
    s = SSE(t.port, "topic=p", {"Last-Event-ID": got[-1]["id"]})
    rest = messages(s.until(lambda ev: ev["event"] == "message" and
                            json.loads(ev["data"])["seq"] == 100, "the last", timeout=20))
    assert first + [m["seq"] for m in rest] == list(range(1, 101))
    s.close()


class CuttingProxy:
    """A TCP proxy to port that cuts each connection once it has forwarded
    a random number of bytes of the server's answers (within budget):
    mid-event, mostly. What the client sends is forwarded as it comes."""

    def __init__(self, port, seed, budget=(300, 3000)):
        self.port_to, self.rng, self.budget = port, random.Random(seed), budget
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            budget = self.rng.randint(*self.budget)
            threading.Thread(target=self._pipe, args=(c, budget), daemon=True).start()

    @staticmethod
    def _upstream(c, u):
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                u.sendall(b)
        except OSError:
            pass

    def _pipe(self, c, budget):
        u = socket.create_connection(("127.0.0.1", self.port_to))
        threading.Thread(target=self._upstream, args=(c, u), daemon=True).start()
        try:
            while budget > 0:
                b = u.recv(min(budget, 4096))
                if not b:
                    break
                c.sendall(b)
                budget -= len(b)
        except OSError:
            pass
        self.cuts += 1
        for x in (c, u):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def close(self):
        self.lsock.close()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_resume_through_a_proxy_that_cuts_no_gap_no_duplicate(tern_factory, threads):
    """Two topics on one stream; a publisher keeps publishing to both while
    the reader's connections are cut again and again; each reconnect sends
    the last dispatched event's id. In the end the reader has every message
    of each topic once, in order. With two threads the streams land on
    either loop, and the publishes (the admin listener's, posted) reach
    them through the batches."""
    t = tern_factory("--feed", "off", "--threads", threads, "--topic", "r.* history=5000")
    proxy = CuttingProxy(t.port, seed=40)
    n = 300
    got = {"r.a": [], "r.b": []}
    gaps = []
    ready = threading.Event()   # an id names both topics: nothing can be missed from now on
    done = threading.Event()

    def read():
        last = None
        while not done.is_set():
            s = SSE(proxy.port, "topic=r.a&topic=r.b",
                    {"Last-Event-ID": last} if last else None)
            try:
                while True:
                    ev = s.next(timeout=10)
                    if ev is None:
                        break
                    if ev["event"] == "message":
                        m = json.loads(ev["data"])
                        got[m["topic"]].append(m["seq"])
                    if ev["event"] == "gap":
                        gaps.append(ev)
                    if ev["id"].count(".") == 2:
                        ready.set()
                    if len(got["r.a"]) >= n and len(got["r.b"]) >= n:
                        done.set()
                        break
            except EOFError:
                pass   # cut inside the head
            finally:
                last = s.last_id or last
                s.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Publish once the reader holds an id of both topics, so that every
    # message is owed to it.
    assert ready.wait(30 * SLOW)
    for i in range(n):
        t.publish("r.a", f"a{i}")
        t.publish("r.b", f"b{i}")
    reader.join(60 * SLOW)
    proxy.close()
    assert done.is_set(), {k: len(v) for k, v in got.items()}
    assert gaps == []
    assert proxy.cuts >= 10
    for topic, seqs in got.items():
        assert seqs == list(range(1, n + 1)), (topic, seqs)


# ---- slow readers ----------------------------------------------------------


@pytest.mark.parametrize("policy", ["drop", "close"])
def test_a_reader_that_stops_reading_is_bounded(tern_factory, policy):
    t = tern_factory("--feed", "off", "--pubsub-max-backlog", "65536",
                     "--topic", f"slow policy={policy}")
    s = SSE(t.port, "topic=slow", rcvbuf=4096)
    s.until(lambda e: e["event"] == "subscribed", "the ack")
    rss = t.rss_kib()
    big = "x" * 16000
    for i in range(400):   # 6.4 MB, a hundred times the limit
        t.publish("slow", big)
    pubsub = lambda: t.stats()["total"]["pubsub"]   # noqa: E731
    if policy == "drop":
        wait_for(lambda: pubsub()["dropped"] > 0, "drops")
    else:
        wait_for(lambda: pubsub()["closed"] == 1, "the close")
    if not SANITIZED:   # the sanitizers hold freed memory back
        assert t.rss_kib() - rss < 8 * 1024   # far under what was published
    # Reading again: what was not dropped, in order; with close, the end.
    seqs, last = [], []

    def read():
        while True:
            ev = s.next(timeout=30)
            last[:] = [ev]
            if ev is None or ev["event"] == "error":
                return
            if ev["event"] == "message":
                m = json.loads(ev["data"])
                seqs.append(m["seq"])
                if m["data"] == "end":
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if policy == "drop":
        # Once the reader has caught up, a message gets through again.
        for _ in range(50):
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
        assert last[0] is not None and json.loads(last[0]["data"]) == {"error": "slow consumer"}
        assert s.next() is None and not s.cut
    s.close()


# ---- shutdown ----------------------------------------------------------------


def test_sigterm_ends_the_streams(tern_factory):
    t = tern_factory("--feed", "off")
    streams = [SSE(t.port, f"topic=s{i}") for i in range(3)]
    for s in streams:
        s.until(lambda e: e["event"] == "subscribed", "the ack")
    started = time.monotonic()
    assert t.stop() == 0
    assert time.monotonic() - started < 5 * SLOW   # not the shutdown's 10 s deadline
    for s in streams:
        assert s.next() is None and not s.cut   # the last chunk: ended, not cut
        s.close()


# ---- a browser -----------------------------------------------------------------

EVENTSOURCE_JS = """
window.__got = []; window.__gaps = 0; window.__subs = 0; window.__opens = 0;
const es = new EventSource('/sse?topic=c.a');
es.onopen = () => window.__opens++;
es.onmessage = e => window.__got.push(JSON.parse(e.data).seq);
es.addEventListener('gap', () => window.__gaps++);
es.addEventListener('subscribed', () => window.__subs++);
'ok'
"""


def test_chromium_eventsource_resumes_by_itself_through_cuts(tern_factory, chromium,  # noqa: F811
                                                              tmp_path):
    """Headless Chromium's own EventSource, through a proxy that cuts its
    connections: it reconnects by itself after the stream's retry, sends
    Last-Event-ID by itself, and gets every message once, in order."""
    t = tern_factory("--feed", "off", "--topic", "c.* history=1000")
    proxy = CuttingProxy(t.port, seed=3, budget=(1500, 2500))
    with chromium_devtools(chromium, tmp_path) as dt:
        try:
            target, s = dt.open_page()
            # The page's origin is the proxy's, so that EventSource is same-origin.
            nav = dt.call("Page.navigate", {"url": f"http://127.0.0.1:{proxy.port}/ping"},
                          session=s)
            assert "errorText" not in nav, nav
            dt.wait_event(lambda e: e.get("method") == "Page.loadEventFired")

            def js(expr):
                r = dt.call("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                            session=s)
                assert "exceptionDetails" not in r, r
                return r["result"]["value"]

            assert js(EVENTSOURCE_JS) == "ok"
            wait_for(lambda: js("window.__subs") >= 1, "the first subscription", timeout=20)
            n = 60
            for i in range(n):
                t.publish("c.a", f"m{i}")
            wait_for(lambda: js("window.__got.length") >= n, "every message", timeout=60)
            assert js("window.__got") == list(range(1, n + 1))
            assert js("window.__gaps") == 0
            assert js("window.__opens") >= 2 and proxy.cuts >= 2   # it did reconnect
            dt.call("Target.closeTarget", {"targetId": target})
        finally:
            proxy.close()
