"""The loop's two back ends, chosen with `tern serve --io`: each says which
it runs on, and the io_uring one holds where its own limits are reached
(more messages in one batch than it has receive buffers, messages larger
than one send). Every other test file runs on the back end $TERN_IO names
(make test runs them on both)."""
import asyncio
import base64
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

import pytest
import websockets

from conftest import SLOW, TERN_BIN
from test_tls import certs  # noqa: F401  (the session's certificates)


def listening_line(*args):
    p = subprocess.Popen([TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0",
                          "--threads", "1", "--admin-listen", "127.0.0.1:0", *args],
                         stderr=subprocess.PIPE)
    try:
        return p.stderr.readline().decode()
    finally:
        p.terminate()
        p.communicate(timeout=10 * SLOW)


def uring_here():
    return "io_uring)" in listening_line("--io", "uring")


def test_each_back_end_says_it_runs():
    assert listening_line("--io", "epoll").rstrip().endswith("(1 thread, epoll)")
    line = listening_line("--io", "uring")
    assert line.rstrip().endswith("(1 thread, io_uring)") or \
        line.rstrip().endswith("(1 thread, epoll)")   # a kernel that refuses it: epoll


def test_a_bad_back_end_is_refused():
    p = subprocess.run([TERN_BIN, "serve", "--port", "0", "--io", "kqueue"],
                       capture_output=True, timeout=10 * SLOW)
    assert p.returncode == 2
    assert b"--io" in p.stderr


needs_uring = pytest.mark.skipif(not uring_here(), reason="io_uring refused here")


def ws_handshake(tern):
    s = socket.create_connection((tern.host, tern.port), timeout=10 * SLOW)
    key = base64.b64encode(os.urandom(16))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
              b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert head.startswith(b"HTTP/1.1 101")
    return s


def read_exactly(s, n):
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        assert b, "closed"
        got += b
    return got


@needs_uring
def test_more_messages_in_one_batch_than_receive_buffers(tern_factory):
    # 128 provided buffers. The server is stopped while 400 connections
    # each send a message, so that on waking it has 400 receives waiting
    # at once. A kernel that completed them all in one go would run out of
    # buffers (ENOBUFS ends those multishot receives; they are armed
    # again); 6.18 completes deferred work in bounded batches, between
    # which the loop gives the buffers back. Either way every message is
    # echoed, once, on its own connection.
    tern = tern_factory("--io", "uring")
    n = 400
    conns = [ws_handshake(tern) for _ in range(n)]
    for rnd in range(2):
        tern.proc.send_signal(signal.SIGSTOP)
        try:
            for i, s in enumerate(conns):
                payload = b"%03d-%d" % (i, rnd)
                s.sendall(bytes([0x82, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
        finally:
            tern.proc.send_signal(signal.SIGCONT)
        for i, s in enumerate(conns):
            payload = b"%03d-%d" % (i, rnd)
            assert read_exactly(s, 2 + len(payload)) == bytes([0x82, len(payload)]) + payload
    for s in conns:
        s.close()


@needs_uring
def test_messages_larger_than_one_send_arrive_whole_and_in_order(tern_factory):
    # A send op takes at most 1 MiB; 5 MB messages go out in several, each
    # after the last completed (short sends re-submitted first), and a slow
    # reader makes the kernel take them in pieces.
    tern = tern_factory("--io", "uring")

    async def main():
        async with websockets.connect(f"ws://127.0.0.1:{tern.port}/ws", compression=None,
                                      max_size=None, max_queue=1) as c:
            msgs = [os.urandom(5_000_000) for _ in range(3)]
            for m in msgs:
                await c.send(m)
            for m in msgs:
                await asyncio.sleep(0.2)   # let the server's sends block on a full socket
                assert await asyncio.wait_for(c.recv(), 20 * SLOW) == m

    asyncio.run(main())


def traced_wss_echo_calls(io, cert, key, n):
    """Runs tern serve --io io under strace, echoes n WebSocket messages over
    wss://, and returns how many socket reads and writes (recv, send, read,
    write and their kin) the server made meanwhile."""
    trace = tempfile.NamedTemporaryFile(prefix="tern-strace-", delete=False).name
    calls = "read,write,readv,writev,recvfrom,sendto,recvmsg,sendmsg"
    p = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=" + calls, "-o", trace,
                          TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
                          "--admin-listen", "off", "--bench-routes", "--io", io,
                          "--tls-port", "0", "--tls-cert", cert, "--tls-key", key],
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = p.stderr.readline().decode()
        port = int(re.search(r"https://127\.0\.0\.1:(\d+)/", line).group(1))
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10 * SLOW),
                            server_hostname="localhost")
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"Sec-WebSocket-Version: 13\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        time.sleep(0.2)   # the handshake's calls are written to the trace
        before = sum(1 for _ in open(trace))
        for i in range(n):
            payload = b"%05d" % i
            s.sendall(bytes([0x82, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
            assert read_exactly(s, 2 + len(payload)) == bytes([0x82, len(payload)]) + payload
        time.sleep(0.2)
        during = sum(1 for _ in open(trace)) - before
        s.close()
        return during
    finally:
        os.killpg(p.pid, signal.SIGTERM)   # tern and strace: tern's end ends the trace
        p.communicate(timeout=10 * SLOW)
        os.unlink(trace)


@needs_uring
@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace (scripts/install-deps.sh test)")
def test_tls_on_io_uring_moves_its_bytes_by_completions(certs):
    # On epoll, each message echoed over wss:// costs the server a read and
    # a write system call (at least); on io_uring a TLS connection's bytes
    # come from the multishot receive and leave by the ring's sends, as a
    # plain connection's do: no socket read or write per message.
    cert, key = certs["default"]
    n = 50
    epoll = traced_wss_echo_calls("epoll", cert, key, n)
    uring = traced_wss_echo_calls("uring", cert, key, n)
    assert epoll >= 2 * n and uring < n // 5, (epoll, uring)
