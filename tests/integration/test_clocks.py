"""No connection without a clock: in every state a connection is either
watched for the peer's close or reset, or has a timer that will end it.

The states and their clocks are in docs/ARCHITECTURE.md ("Connection
states and their clocks"); each test here names the state it checks."""
import os
import socket
import time

from conftest import SANITIZED, SLOW, read_response, recv_until_closed
from test_faults import masked, ping, rst_close, send_until_stalled, wait_fds, ws_open


def anon_kib(tern):
    with open(f"/proc/{tern.proc.pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def closed_within(s, seconds):
    """True when the server closes s (EOF or reset) within `seconds`,
    reading and discarding whatever comes first."""
    s.settimeout(0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not s.recv(1 << 20):
                return True
        except socket.timeout:
            pass
        except ConnectionResetError:
            return True
    return False


# ---- a streamed body that is empty ------------------------------------------

def test_empty_streamed_body_is_answered(tern):
    # State: waiting for a handler that reads its body as a stream. With no
    # body, the reader is told its end at once, like any other body.
    fds0 = tern.open_fds()
    for head in (b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                 b"POST /upload HTTP/1.1\r\nHost: x\r\n\r\n"):
        s = tern.connect(timeout=2 * SLOW)
        s.sendall(head + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        st, h, body, rest = read_response(s, timeout=2 * SLOW)
        assert (st, body) == (200, b"0 0\n")
        s.settimeout(2 * SLOW)
        while b"pong" not in rest:   # the pipelined request behind it is served too
            rest += s.recv(4096)
        s.close()
    assert wait_fds(tern, fds0) == fds0


# ---- a pending answer (async handler): watched, no timer --------------------

def test_close_during_a_pending_answer_aborts_it_at_once(tern):
    fds0 = tern.open_fds()
    for _ in range(20):
        s = tern.connect()
        s.sendall(b"GET /delay?ms=30000 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.02)
        t0 = time.monotonic()
        s.close()
        # The server closes the connection (the client has gone), without
        # waiting for the 30 s answer.
        assert wait_fds(tern, fds0, timeout=2) == fds0
        assert time.monotonic() - t0 < 2 * SLOW
    assert ping(tern)


def test_fin_during_a_pending_answer_still_gets_it(tern):
    # A half-close is not a departure (Go answers; item 14 of issue #25).
    s = tern.connect()
    s.sendall(b"GET /delay?ms=300 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.02)
    s.shutdown(socket.SHUT_WR)
    t0 = time.monotonic()
    out = recv_until_closed(s, 5 * SLOW)
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), out
    assert out.endswith(b"done\n") or b"done" in out
    assert time.monotonic() - t0 >= 0.2
    s.close()


def test_reset_during_a_pending_answer_aborts_it_at_once(tern):
    fds0 = tern.open_fds()
    for _ in range(20):
        s = tern.connect()
        s.sendall(b"GET /delay?ms=30000 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.02)
        rst_close(s)
    # 20 timers of 30 s would hold 20 descriptors; the aborts free them now.
    assert wait_fds(tern, fds0, timeout=3) == fds0
    assert ping(tern)


def test_shutdown_does_not_wait_for_aborted_requests(tern_factory):
    tern = tern_factory("--shutdown-timeout", "20000")
    socks = []
    for _ in range(5):
        s = tern.connect()
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        read_response(s)
        s.sendall(b"GET /delay?ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    time.sleep(0.1)
    for s in socks:
        rst_close(s)
    time.sleep(0.2)
    t0 = time.monotonic()
    assert tern.stop() == 0
    assert time.monotonic() - t0 < 3 * SLOW


# ---- sending: the send clock, measured from the last progress ---------------

def read_head(s):
    """Reads a response head byte by byte (leaving the body unread)."""
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return head


def slow_read(s, total, pause, chunk=65536, limit=60):
    """Reads total bytes of s, pausing between reads; returns the bytes."""
    got = bytearray()
    s.settimeout(5 * SLOW)
    deadline = time.monotonic() + limit
    while len(got) < total and time.monotonic() < deadline:
        b = s.recv(chunk)
        if not b:
            break
        got += b
        time.sleep(pause)
    return bytes(got)


def test_slow_steady_reader_gets_the_whole_response(tern_factory):
    # State: sending, after the handler has ended its response. The idle
    # clock must not run while bytes are leaving (it used to cut this at
    # 16 of 20 MB); the send clock does, and the reader makes progress.
    # The send timeout is long against a busy machine's stalls of the
    # reader (a few hundred ms under two CPU burners), and still a few
    # times shorter than the transfer; no send timeout may be logged.
    tern = tern_factory("--idle-timeout", "200", "--send-timeout", "1000", "--log-level", "info")
    s = tern.connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"GET /stream?chunks=200&size=100000 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_head(s).startswith(b"HTTP/1.1 200")
    # 20 MB at about 6 MB/s: 3 s, many idle timeouts long.
    data = slow_read(s, 20_000_000 + 200 * 12, 0.01)
    body = bytearray()
    rest = data
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2:]
    assert len(body) == 20_000_000
    assert body[:100000] == b"a" * 100000 and body[-100000:] == bytes([ord("a") + 199 % 26]) * 100000
    # Everything is out: now the idle clock runs and ends the connection.
    assert closed_within(s, 3 * SLOW)
    assert tern.stop() == 0
    assert "send timeout" not in tern.stderr


def test_slow_steady_reader_gets_a_whole_static_file(tern_factory, tmp_path):
    # The same for a file sent with sendfile().
    blob = os.urandom(1 << 20) * 20
    (tmp_path / "big.bin").write_bytes(blob)
    tern = tern_factory("--root", str(tmp_path), "--idle-timeout", "200", "--send-timeout", "400")
    s = tern.connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_head(s).startswith(b"HTTP/1.1 200")
    body = slow_read(s, len(blob), 0.01)
    assert len(body) == len(blob) and body == blob
    s.close()


def test_steady_reader_slower_than_the_kernel_frees_room_is_not_cut(tern_factory, tmp_path):
    # A socket's send buffer grows to megabytes and takes more only once a
    # third of it is free: a reader at 1.6 MB/s leaves the kernel taking
    # nothing for most of a second at a time, far past a 300 ms send
    # timeout. It is still reading (the peer acknowledges what the kernel
    # holds), so the send clock must not cut it: a static file (sendfile)
    # and a handler's stream (the backlog) alike.
    blob = os.urandom(1 << 20) * 6
    (tmp_path / "six.bin").write_bytes(blob)
    tern = tern_factory("--root", str(tmp_path), "--send-timeout", "300", "--log-level", "info")
    for path, size in ((b"/six.bin", len(blob)), (b"/echo?size=6000000", 6_000_000)):
        s = tern.connect()
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = read_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        body = slow_read(s, size, 0.02, chunk=32768)
        assert len(body) == size, (path, len(body))
        if path == b"/six.bin":
            assert body == blob
        s.close()
    assert tern.stop() == 0
    assert "send timeout" not in tern.stderr


def test_client_that_never_reads_is_cut_at_the_send_timeout(tern_factory):
    # State: sending, with no progress. Both with Connection: close (the
    # response has ended and the connection is to close once flushed) and
    # keep-alive (idle after the response, but bytes are still queued).
    tern = tern_factory("--send-timeout", "500", "--log-level", "info")
    fds0 = tern.open_fds()
    anon0 = anon_kib(tern)
    socks = []
    for close in (True, False):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((tern.host, tern.port))
        s.sendall(b"GET /echo?size=20000000 HTTP/1.1\r\nHost: x\r\n" +
                  (b"Connection: close\r\n" if close else b"") + b"\r\n")
        socks.append(s)
    time.sleep(0.3)
    if not SANITIZED:
        assert anon_kib(tern) - anon0 > 10 * 1024   # the two backlogs are there...
    assert wait_fds(tern, fds0, timeout=3) == fds0   # ...and are dropped after 500 ms
    if not SANITIZED:
        assert anon_kib(tern) - anon0 < 8 * 1024
    for s in socks:
        s.close()
    assert ping(tern)
    assert tern.stop() == 0
    assert "send timeout" in tern.stderr


def test_stalled_sends_are_bounded_across_connections(tern_factory):
    # Many clients that never read: the total of unsent output is bounded
    # by --max-unsent; a send that would pass it closes its connection.
    tern = tern_factory("--max-unsent", str(24 << 20))
    anon0 = anon_kib(tern)
    socks = []
    for _ in range(8):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((tern.host, tern.port))
        s.sendall(b"GET /echo?size=10000000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        socks.append(s)
        time.sleep(0.05)
    time.sleep(0.3 * SLOW)
    if not SANITIZED:
        grown = anon_kib(tern) - anon0
        assert grown < 40 * 1024, f"anonymous memory grew {grown} KiB"
    # Those past the bound were closed: reading them ends before 10 MB.
    cut = 0
    for s in socks:
        got = len(recv_until_closed(s, 5 * SLOW))
        if got < 10_000_000:
            cut += 1
        s.close()
    assert 4 <= cut < 8
    assert ping(tern)
    assert tern.stop() == 0
    assert "unsent on this loop" in tern.stderr


# ---- idle keep-alive: FIN and reset -------------------------------------------

def test_idle_connection_fin_and_reset_are_noticed(tern):
    fds0 = tern.open_fds()
    a, b = tern.connect(), tern.connect()
    for s in (a, b):
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(s)
    a.shutdown(socket.SHUT_WR)
    assert recv_until_closed(a, 2 * SLOW) == b""
    rst_close(b)
    a.close()
    assert wait_fds(tern, fds0, timeout=2) == fds0


# ---- WebSocket: a paused connection still sees the peer go ------------------

def test_paused_websocket_sees_a_reset(tern):
    # /ws pauses reading from a peer that does not read its echoes; a reset
    # must still be noticed (the socket stays watched while paused).
    fds0 = tern.open_fds()
    s = ws_open(tern)
    sent, stalled = send_until_stalled(s, masked(2, b"z" * 65536))
    assert stalled
    rst_close(s)
    assert wait_fds(tern, fds0, timeout=2) == fds0
