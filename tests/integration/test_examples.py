"""The programs in examples/ build against the public headers only and do
what their comments say.

The examples are found next to TERN_BIN (build/examples/, or
build-asan/examples/ when the suite runs under the sanitizers); stop()
fails on a sanitizer report in an example's stderr, as conftest does for
tern itself."""
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import aiohttp

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(TERN_BIN)), "examples")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} was not built")
    port = free_port()
    proc = subprocess.Popen([path, str(port)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 5 * SLOW
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    pytest.fail(f"{name} did not listen: {proc.communicate()[1]!r}")


def start_any_port(name, *args):
    """Starts an example on port 0 and reads its port from the first line
    it prints ("NAME: listening on http://127.0.0.1:PORT/")."""
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} was not built")
    proc = subprocess.Popen([path, "0", *args], stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode(errors="replace")
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
    if not m:
        proc.kill()
        pytest.fail(f"{name} did not start: {line!r} {proc.communicate()[1]!r}")
    return proc, int(m.group(1))


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10 * SLOW)
    err = err.decode(errors="replace")
    assert "Sanitizer" not in err and "runtime error:" not in err, err
    assert proc.returncode == 0, err


def test_hello_http():
    proc, port = start("hello_http")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello/world", timeout=5) as r:
            assert r.read() == b"hello, world\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as r:
            assert r.read() == b"pong"
    finally:
        stop(proc)


def test_ws_echo_one_line_server():
    proc, port = start("ws_echo")
    try:
        with connect(f"ws://127.0.0.1:{port}/any/path") as ws:
            ws.send("one line")
            assert ws.recv() == "one line"
            ws.send(b"\x00\x01")
            assert ws.recv() == b"\x00\x01"
    finally:
        stop(proc)


# ---- json_api: answers from a worker thread and from timers ---------------

def get_json(port, path, timeout=10.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def wait_idle(port, timeout=5.0):
    """Polls /health until no job and no timer is left; returns the last answer."""
    deadline = time.monotonic() + timeout * SLOW
    while True:
        _, h = get_json(port, "/health")
        if (h["jobs"], h["timers"]) == (0, 0) or time.monotonic() > deadline:
            return h
        time.sleep(0.05)


@pytest.fixture
def json_api():
    proc, port = start_any_port("json_api")
    yield port
    stop(proc)


def test_json_api_worker_and_timer_answer_concurrent_requests(json_api):
    async def main():
        async with aiohttp.ClientSession() as session:
            async def get(path):
                async with session.get(f"http://127.0.0.1:{json_api}{path}") as r:
                    assert r.headers["Content-Type"] == "application/json"
                    return r.status, await r.json()

            t0 = time.monotonic()
            results = await asyncio.gather(
                *(get(f"/primes?below={1000 * (i + 1)}") for i in range(20)),
                *(get("/delay?ms=400") for _ in range(20)),
                get("/health"))
            return results, time.monotonic() - t0

    results, elapsed = asyncio.run(asyncio.wait_for(main(), 30 * SLOW))
    primes = [0, 168, 303, 430, 550, 669, 783, 900, 1007, 1117, 1229, 1335, 1438, 1547,
              1652, 1754, 1862, 1960, 2064, 2158, 2262]
    for i, (status, body) in enumerate(results[:20]):
        assert status == 200
        assert body == {"below": 1000 * (i + 1), "primes": primes[i + 1]}
    assert results[20:40] == [(200, {"delayed_ms": 400})] * 20
    assert results[40][0] == 200 and results[40][1]["ok"] is True
    # The timers ran side by side, not one after the other (20 x 400 ms).
    assert elapsed < 3 * SLOW, elapsed
    assert wait_idle(json_api) == {"ok": True, "jobs": 0, "timers": 0}


def test_json_api_bad_query_is_400(json_api):
    assert get_json(json_api, "/primes?below=lots")[0] == 400
    assert get_json(json_api, "/primes")[0] == 400
    assert get_json(json_api, "/delay?ms=-1")[0] == 400


def send_and_leave(port, path, reset):
    """Sends a request; the caller closes the socket without reading the
    answer. reset: close with a RST (SO_LINGER 0) instead of a FIN."""
    s = socket.create_connection(("127.0.0.1", port))
    if reset:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def wait_held(port, jobs, timers):
    """Waits until the handlers hold at least that many requests."""
    deadline = time.monotonic() + 5 * SLOW
    while True:
        _, h = get_json(port, "/health")
        if h["jobs"] >= jobs and h["timers"] >= timers:
            return
        assert time.monotonic() < deadline, h
        time.sleep(0.02)


def test_json_api_client_that_leaves_before_the_answer(json_api):
    # Clients that go away (FIN or RST) while the worker or a timer still
    # has their request: the server stays healthy, every job comes back and
    # is freed, and later requests are answered. LeakSanitizer checks at
    # exit that nothing was left behind.
    socks = [send_and_leave(json_api, "/primes?below=10&sleep_ms=500", True),
             send_and_leave(json_api, "/primes?below=100&sleep_ms=10", False),
             send_and_leave(json_api, "/delay?ms=300", True),
             send_and_leave(json_api, "/delay?ms=300", False)]
    wait_held(json_api, 1, 2)
    for s in socks:
        s.close()
    assert wait_idle(json_api) == {"ok": True, "jobs": 0, "timers": 0}
    assert get_json(json_api, "/primes?below=100") == (200, {"below": 100, "primes": 25})
    assert get_json(json_api, "/delay?ms=1") == (200, {"delayed_ms": 1})


def test_json_api_reset_client_is_aborted_at_once(json_api):
    # A client that resets its connection while a timer holds its request:
    # the abort callback stops the timer and frees its state right away.
    s = send_and_leave(json_api, "/delay?ms=4000", True)
    wait_held(json_api, 0, 1)
    s.close()
    deadline = time.monotonic() + 1.5
    while get_json(json_api, "/health")[1]["timers"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert get_json(json_api, "/health")[1]["timers"] == 0


def test_json_api_sigterm_finishes_answers_in_flight_then_exits_0():
    proc, port = start_any_port("json_api")
    answers = {}

    def ask(path):
        answers[path] = get_json(port, path)

    threads = [threading.Thread(target=ask, args=(p,))
               for p in ["/primes?below=1000&sleep_ms=500", "/delay?ms=500"]]
    try:
        for t in threads:
            t.start()
        time.sleep(0.2 * SLOW)
    finally:
        stop(proc)   # SIGTERM; waits for exit 0, no sanitizer report
    for t in threads:
        t.join(5)
    assert answers == {"/primes?below=1000&sleep_ms=500": (200, {"below": 1000, "primes": 168}),
                       "/delay?ms=500": (200, {"delayed_ms": 500})}


# ---- chat: a WebSocket room with broadcast and a slow-consumer policy -----

class Room:
    """A running examples/chat and the clients a test opened on it (closed
    at the end, before the server is stopped)."""
    def __init__(self, port, stack):
        self.port, self.stack = port, stack

    def connect(self, query=""):
        return self.stack.enter_context(
            connect(f"ws://127.0.0.1:{self.port}/chat{query}", open_timeout=5 * SLOW))

    def join(self, name):
        """Connects as name and waits for the room's "* name joined" line."""
        ws = self.connect(f"?name={name}")
        recv_line(ws, f"* {name} joined")
        return ws


@pytest.fixture
def chat():
    proc, port = start_any_port("chat")
    try:
        with contextlib.ExitStack() as stack:
            yield Room(port, stack)
    finally:
        stop(proc)


def recv_line(ws, prefix, timeout=5.0):
    """Receives until a message that starts with prefix; skips the others
    (join and leave notices of other members)."""
    deadline = time.monotonic() + timeout * SLOW
    while True:
        msg = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        if msg.startswith(prefix):
            return msg


def assert_silent(ws, wait=0.3):
    with pytest.raises(TimeoutError):
        print(ws.recv(timeout=wait))


def test_chat_messages_reach_all_others(chat):
    alice, bob, carol = chat.join("alice"), chat.join("bob"), chat.join("carol")
    assert recv_line(alice, "* carol") == "* carol joined (3 here)"
    assert recv_line(bob, "* carol") == "* carol joined (3 here)"
    alice.send("hello, room")
    assert recv_line(bob, "alice:") == "alice: hello, room"
    assert recv_line(carol, "alice:") == "alice: hello, room"
    carol.send("hi alice")
    assert recv_line(alice, "carol:") == "carol: hi alice"
    assert recv_line(bob, "carol:") == "carol: hi alice"
    assert_silent(alice)   # nobody hears their own line back
    assert_silent(carol)


def test_chat_member_that_leaves_is_removed(chat):
    alice, bob, carol = chat.join("alice"), chat.join("bob"), chat.join("carol")
    bob.close()
    assert recv_line(alice, "* bob left") == "* bob left (2 here)"
    assert recv_line(carol, "* bob left") == "* bob left (2 here)"
    carol.send("still here?")
    assert recv_line(alice, "carol:") == "carol: still here?"
    dave = chat.join("dave")
    assert recv_line(alice, "* dave") == "* dave joined (3 here)"
    dave.send("hi all")
    assert recv_line(alice, "dave:") == "dave: hi all"
    assert recv_line(carol, "dave:") == "dave: hi all"


def test_chat_refuses_bad_names_and_binary(chat):
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    for name in ["has%20space", "x" * 33, "bad%zz"]:
        with pytest.raises(InvalidStatus) as e:
            chat.connect(f"?name={name}")
        assert e.value.response.status_code == 400
    guest = chat.connect()
    assert recv_line(guest, "* guest-") == "* guest-1 joined (1 here)"
    guest.send(b"\x00binary")
    with pytest.raises(ConnectionClosed):
        guest.recv(timeout=5 * SLOW)
    assert guest.close_code == 1003


def raw_ws_connect(port, path, rcvbuf):
    """A WebSocket client on a raw socket with a small receive buffer, so it
    can stop reading for real. Returns (socket, bytes read past the 101)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.settimeout(5 * SLOW)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return s, rest


def read_frames_until_close(sock, buf, timeout):
    """Reads server frames (unmasked) until a close frame; returns its code,
    or None if the connection ended without one."""
    sock.settimeout(timeout)
    while True:
        while len(buf) >= 2:
            op, n = buf[0] & 0x0F, buf[1] & 0x7F
            hl = 2
            if n == 126:
                hl, n = 4, int.from_bytes(buf[2:4], "big") if len(buf) >= 4 else 1 << 62
            elif n == 127:
                hl, n = 10, int.from_bytes(buf[2:10], "big") if len(buf) >= 10 else 1 << 62
            if len(buf) < hl + n:
                break
            payload, buf = buf[hl:hl + n], buf[hl + n:]
            if op == 8:
                return int.from_bytes(payload[:2], "big")
        try:
            b = sock.recv(1 << 20)
        except (ConnectionResetError, socket.timeout):
            return None
        if not b:
            return None
        buf += b


def test_chat_slow_member_is_closed_with_1008_and_the_others_keep_receiving(chat):
    # slow joins with a tiny receive buffer and never reads while alice
    # floods the room (6 MB): its backlog passes the hard limit, tern closes
    # it with 1008, its on_close runs (the room says so) and bob, who reads,
    # gets every line. This is the re-entrant close case: the close is
    # decided inside tern_ws_send_prepared, in chat.c's broadcast loop,
    # which must not see its member freed under it.
    alice = chat.join("alice")
    bob = chat.join("bob")
    slow, slow_buf = raw_ws_connect(chat.port, "/chat?name=slow", 4096)
    recv_line(bob, "* slow joined")
    n, size = 2000, 3000
    got = []

    def read_all():
        try:
            while True:
                msg = bob.recv(timeout=20 * SLOW)
                got.append(msg)
                if msg == "alice: done":
                    return
        except Exception as e:   # the assertion below shows what was missing
            got.append(repr(e))

    reader = threading.Thread(target=read_all)
    reader.start()
    line = "x" * size
    for i in range(n):
        alice.send(f"{i:05d} {line}")
        # bob reads as fast as Python can, which on a busy machine is not
        # always as fast as alice writes: keep him within 40 lines (120 KB,
        # under the 256 KiB limit) so that only slow is the slow one.
        deadline = time.monotonic() + 10 * SLOW
        while i - len(got) > 40 and time.monotonic() < deadline:
            time.sleep(0.001)
    alice.send("done")
    reader.join(30 * SLOW)
    floods = [m for m in got if m.startswith("alice: ") and m != "alice: done"]
    assert len(floods) == n, got[-3:]
    assert [int(m[7:12]) for m in floods] == list(range(n))
    assert "* slow left, too slow (2 here)" in got
    assert got[-1] == "alice: done"
    # slow now reads what was queued for it: the messages up to the limit,
    # then the close frame with 1008.
    assert read_frames_until_close(slow, slow_buf, 5 * SLOW) == 1008
    slow.close()
    # The room goes on.
    bob.send("after")
    assert recv_line(alice, "bob:") == "bob: after"


# ---- market: snapshots of 10 x 10 000 bytes, a periodic publisher ---------

@pytest.fixture
def market():
    proc, port = start_any_port("market", "50")   # a tick every 50 ms
    yield port, proc
    stop(proc)


def check_snapshot(pages):
    """Ten pages of 10 000 bytes, in order, all of one tick."""
    assert [type(p) for p in pages] == [bytes] * 10
    assert [len(p) for p in pages] == [10000] * 10
    heads = [re.match(rb"seq (\d{10}) page (\d\d)/10 +\n", p) for p in pages]
    assert all(heads), [p[:40] for p in pages]
    assert [int(h.group(2)) for h in heads] == list(range(1, 11))
    assert len({h.group(1) for h in heads}) == 1   # built once, from one tick
    return int(heads[0].group(1))


def test_market_snapshot_is_10_messages_of_10000_bytes(market):
    port, _ = market
    with connect(f"ws://127.0.0.1:{port}/market") as ws:
        ws.send("snapshot")
        check_snapshot([ws.recv(timeout=5 * SLOW) for _ in range(10)])
        assert_silent(ws)   # exactly 10, and no ticks without "subscribe"
        ws.send("again")    # any other word asks too
        check_snapshot([ws.recv(timeout=5 * SLOW) for _ in range(10)])
        assert_silent(ws)


def test_market_50_clients_get_their_snapshots_concurrently(market):
    from websockets.asyncio.client import connect as aconnect
    port, _ = market

    async def client():
        async with aconnect(f"ws://127.0.0.1:{port}/market", max_size=None) as ws:
            seqs = []
            for _ in range(2):
                await ws.send("snapshot")
                seqs.append(check_snapshot([await ws.recv() for _ in range(10)]))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.2)
            return seqs

    async def main():
        t0 = time.monotonic()
        seqs = await asyncio.gather(*(client() for _ in range(50)))
        return seqs, time.monotonic() - t0

    seqs, elapsed = asyncio.run(asyncio.wait_for(main(), 60 * SLOW))
    assert len(seqs) == 50 and all(a <= b for a, b in seqs)
    assert elapsed < 10 * SLOW, elapsed   # 100 snapshots, 10 MB


def test_market_subscribers_get_every_tick(market):
    port, _ = market
    with connect(f"ws://127.0.0.1:{port}/market") as ws:
        ws.send("subscribe")
        ticks = [json.loads(ws.recv(timeout=5 * SLOW)) for _ in range(5)]
        seqs = [t["seq"] for t in ticks]
        assert seqs == list(range(seqs[0], seqs[0] + 5))
        assert all(len(t["moves"]) == 5 for t in ticks)
        # A snapshot asked for meanwhile comes whole, between two ticks.
        ws.send("snapshot")
        got = []
        while sum(isinstance(m, bytes) for m in got) < 10:
            got.append(ws.recv(timeout=5 * SLOW))
        first = next(i for i, m in enumerate(got) if isinstance(m, bytes))
        seq = check_snapshot(got[first:first + 10])
        assert all(json.loads(m)["seq"] <= seq for m in got[:first])
        ws.send("unsubscribe")
        time.sleep(0.3 * SLOW)   # what was already on its way
        while True:
            try:
                ws.recv(timeout=0.01)
            except TimeoutError:
                break
        assert_silent(ws, 0.3)


def test_market_client_that_does_not_read_is_bounded_by_dropping(market):
    # A client asks for 300 snapshots (30 MB) and does not read: the drop
    # policy keeps the server's memory bounded (about 1 MiB of backlog)
    # and the client connected; another client is served meanwhile.
    port, proc = market
    slow, buf = raw_ws_connect(port, "/market", 4096)
    rss0 = rss_kib(proc.pid)
    for _ in range(300):
        slow.sendall(b"\x81\x88mask" + bytes(a ^ b for a, b in zip(b"snapshot", b"mask" * 2)))
    time.sleep(1.5 * SLOW)   # past the grace period
    with connect(f"ws://127.0.0.1:{port}/market") as ws:
        ws.send("snapshot")
        check_snapshot([ws.recv(timeout=5 * SLOW) for _ in range(10)])
    assert rss_kib(proc.pid) - rss0 < 16 * 1024
    # The slow client is still connected and gets much less than it asked
    # for: what fitted in its backlog and the socket buffers.
    slow.settimeout(1.0 * SLOW)
    total = len(buf)
    try:
        while b := slow.recv(1 << 20):
            total += len(b)
    except socket.timeout:
        pass
    assert 10000 < total < 10 * 1024 * 1024, total
    slow.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


def run_example(name, *args):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} was not built")
    p = subprocess.run([path, *args], capture_output=True, timeout=20 * SLOW)
    err = p.stderr.decode(errors="replace")
    assert "ERROR: AddressSanitizer" not in err and "runtime error:" not in err, err
    assert "LeakSanitizer" not in err, err
    return p.returncode, p.stdout.decode(), err


def test_ws_client_against_tern(tern):
    code, out, err = run_example("ws_client", f"ws://127.0.0.1:{tern.port}/ws", "hello", "world")
    assert code == 0, err
    assert out == "hello\nworld\n"
    assert "open (compressed)" in err and "closed 1000" in err, err
    port = free_port()   # nothing listens there
    code, out, err = run_example("ws_client", f"ws://127.0.0.1:{port}/ws", "x")
    assert code == 1, err
    assert "Connection refused" in err, err
