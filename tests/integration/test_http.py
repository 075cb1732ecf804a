"""HTTP/1.1 behaviour of `tern serve`, through curl, http.client, h11,
aiohttp and raw sockets."""
import asyncio
import http.client
import os
import socket
import subprocess
import threading
import time

import aiohttp
import h11
import pytest

from conftest import SANITIZED, SLOW, read_response, recv_until_closed


def get(tern, path, headers=None, method="GET", body=None):
    c = http.client.HTTPConnection(tern.host, tern.port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r, data


# ---- the demo routes ------------------------------------------------------

def test_ping_with_curl(tern):
    out = subprocess.run(["curl", "-sS", "-i", f"{tern.base}/ping"],
                         capture_output=True, check=True, timeout=10).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"\r\nContent-Length: 4" in head
    assert b"\r\nContent-Type: text/plain" in head
    assert b"\r\nDate: " in head
    assert body == b"pong"


@pytest.mark.parametrize("size", [0, 1, 64, 4096, 65536, 1 << 20])
def test_echo_get_sizes(tern, size):
    r, data = get(tern, f"/echo?size={size}")
    assert r.status == 200
    assert data == b"x" * size


@pytest.mark.parametrize("query", ["size=-1", "size=abc", "size=", "", "size=99999999999"])
def test_echo_get_bad_size_is_400(tern, query):
    r, data = get(tern, f"/echo?{query}")
    assert r.status == 400


@pytest.mark.parametrize("size", [0, 1, 4096, 65536, 1 << 20, 5 << 20])
def test_echo_post_sizes(tern, size):
    body = os.urandom(size)
    r, data = get(tern, "/echo", method="POST", body=body,
                  headers={"Content-Type": "application/x-test"})
    assert r.status == 200
    assert r.getheader("Content-Type") == "application/x-test"
    assert data == body


def test_unknown_path_is_404_and_wrong_method_405_with_allow(tern):
    r, _ = get(tern, "/nope")
    assert r.status == 404
    r, _ = get(tern, "/ping", method="DELETE")
    assert r.status == 405
    assert "GET" in r.getheader("Allow")


def test_head_has_length_but_no_body(tern):
    s = tern.connect()
    s.sendall(b"HEAD /echo?size=1000 HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    data = b""
    while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"pong"):
        chunk = s.recv(65536)
        assert chunk
        data += chunk
    first, _, rest = data.partition(b"\r\n\r\n")
    assert b"Content-Length: 1000" in first
    assert rest.startswith(b"HTTP/1.1 200 OK")   # no body bytes between the two
    s.close()


# ---- keep-alive and pipelining ------------------------------------------

def test_keep_alive_many_requests_one_connection(tern):
    c = http.client.HTTPConnection(tern.host, tern.port, timeout=10)
    for i in range(200):
        c.request("GET", f"/echo?size={i}")
        r = c.getresponse()
        assert r.status == 200
        assert r.read() == b"x" * i
    c.close()


def test_pipelined_requests_answered_in_order(tern):
    s = tern.connect()
    reqs = b"".join(f"GET /echo?size={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(100))
    s.sendall(reqs)
    rest = b""
    for i in range(100):
        st, h, body, rest = read_response_from(s, rest)
        assert st == 200
        assert body == b"x" * i
    s.close()


def read_response_from(sock, pending, for_head=False):
    """read_response, but starting with bytes already read."""
    class Prefixed:
        def __init__(self, s, pre):
            self.s, self.pre = s, pre
        def recv(self, n):
            if self.pre:
                b, self.pre = self.pre, b""
                return b
            return self.s.recv(n)
        def settimeout(self, t):
            self.s.settimeout(t)
    return read_response(Prefixed(sock, pending), for_head=for_head)


def test_pipelined_async_then_inline_keeps_order(tern):
    s = tern.connect()
    s.sendall(b"GET /delay?ms=200 HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
              b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    rest = b""
    st, h, body, rest = read_response_from(s, rest)
    assert body == b"done\n"
    st, h, body, rest = read_response_from(s, rest)
    assert body == b"pong"
    st, h, body, rest = read_response_from(s, rest)
    assert body == b"hello"
    s.close()


def test_http10_closes_unless_keep_alive(tern):
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
    data = recv_until_closed(s)
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"pong")
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert h.get("connection") == "keep-alive"
    s.sendall(b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert body == b"pong"
    s.close()


def test_connection_close_is_honoured(tern):
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    data = recv_until_closed(s)
    assert data.count(b"HTTP/1.1 200") == 1
    assert b"Connection: close" in data


# ---- bodies ---------------------------------------------------------------

def test_chunked_request_body(tern):
    s = tern.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nTrailer: x\r\n\r\n")
    st, h, body, _ = read_response(s)
    assert st == 200 and body == b"hello world!"
    s.close()


def test_chunked_request_body_byte_by_byte(tern):
    s = tern.connect()
    msg = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n")
    for b in msg:
        s.send(bytes([b]))
    st, h, body, _ = read_response(s)
    assert body == b"abc0123456789abcdef"
    s.close()


def test_chunked_response(tern):
    r, data = get(tern, "/stream?chunks=50&size=1000")
    assert r.status == 200
    assert r.getheader("Transfer-Encoding") == "chunked"
    assert data == b"".join(bytes([97 + i % 26]) * 1000 for i in range(50))


def test_chunked_response_to_http10_is_close_delimited(tern):
    s = tern.connect()
    s.sendall(b"GET /stream?chunks=3&size=4 HTTP/1.0\r\n\r\n")
    data = recv_until_closed(s)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head
    assert body == b"aaaabbbbcccc"


def test_streamed_upload_counts_every_byte(tern):
    body = os.urandom(3 << 20)
    r, data = get(tern, "/upload", method="POST", body=body)
    n, checksum = data.split()
    expect = 0
    for b in body:
        expect = (expect * 31 + b) & 0xFFFFFFFF
    assert int(n) == len(body)
    assert int(checksum) == expect


def test_expect_100_continue(tern):
    s = tern.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert st == 100
    s.sendall(b"hello")
    st, h, body, rest = read_response_from(s, rest)
    assert st == 200 and body == b"hello"
    s.close()


def test_expect_100_continue_refused_when_too_large(tern_factory):
    tern = tern_factory("--max-body", "1000")
    s = tern.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert st == 413
    assert h.get("connection") == "close"


def test_curl_expect_100_continue_upload(tern, tmp_path):
    f = tmp_path / "up.bin"
    f.write_bytes(os.urandom(2 << 20))
    out = subprocess.run(["curl", "-sS", "-H", "Expect: 100-continue", "--data-binary", f"@{f}",
                          f"{tern.base}/echo"], capture_output=True, check=True, timeout=20).stdout
    assert out == f.read_bytes()


def test_h11_client_round_trip(tern):
    s = tern.connect()
    conn = h11.Connection(our_role=h11.CLIENT)
    body = b"h11 body " * 100
    s.sendall(conn.send(h11.Request(method="POST", target="/echo",
                                    headers=[("Host", "x"), ("Content-Length", str(len(body)))])))
    s.sendall(conn.send(h11.Data(data=body)))
    s.sendall(conn.send(h11.EndOfMessage()))
    got = b""
    status = None
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            conn.receive_data(s.recv(65536))
            continue
        if isinstance(ev, h11.Response):
            status = ev.status_code
        elif isinstance(ev, h11.Data):
            got += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            break
    assert status == 200 and got == body
    s.close()


def test_aiohttp_concurrent_clients(tern):
    async def main():
        async with aiohttp.ClientSession() as session:
            async def one(i):
                async with session.post(f"{tern.base}/echo", data=b"y" * i) as r:
                    assert r.status == 200
                    return await r.read()
            results = await asyncio.gather(*(one(i) for i in range(300)))
            for i, r in enumerate(results):
                assert r == b"y" * i
    asyncio.run(main())


# ---- limits and refusals ------------------------------------------------

def raw(tern, data, timeout=5.0):
    s = tern.connect()
    s.sendall(data)
    out = recv_until_closed(s, timeout)
    s.close()
    return out


def status_of(resp):
    return int(resp.split(b" ", 2)[1]) if resp else None


@pytest.mark.parametrize("req,status", [
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n", 400),
    (b"GET / HTTP/1.1\nHost: x\n\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nExpect: something\r\n\r\n", 417),
])
def test_malformed_requests_get_their_status_and_close(tern, req, status):
    out = raw(tern, req)
    assert status_of(out) == status, out
    assert b"Connection: close" in out


def test_uri_too_long_is_414(tern):
    out = raw(tern, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(out) == 414


def test_head_too_large_is_431(tern):
    out = raw(tern, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 17000 + b"\r\n\r\n")
    assert status_of(out) == 431


def test_too_many_headers_is_431(tern):
    hdrs = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    out = raw(tern, b"GET /ping HTTP/1.1\r\nHost: x\r\n" + hdrs + b"\r\n")
    assert status_of(out) == 431
    hdrs = b"".join(b"X-H%d: v\r\n" % i for i in range(98))   # + Host + Connection = 100
    out = raw(tern, b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + hdrs + b"\r\n")
    assert status_of(out) == 200


def test_body_too_large_is_413(tern_factory):
    tern = tern_factory("--max-body", "1024")
    out = raw(tern, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n" + b"z" * 1025)
    assert status_of(out) == 413
    out = raw(tern, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n" + b"z" * 1024)
    assert status_of(out) == 200
    chunked = b"400\r\n" + b"c" * 1024 + b"\r\n1\r\nc\r\n0\r\n\r\n"
    out = raw(tern, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    assert status_of(out) == 413


# ---- timeouts ------------------------------------------------------------

def test_slow_head_gets_408(tern_factory):
    tern = tern_factory("--head-timeout", "300")
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.1\r\nHost:")
    t0 = time.monotonic()
    out = recv_until_closed(s, 5)
    assert status_of(out) == 408
    assert 0.25 < time.monotonic() - t0 < 2.5 * SLOW


def test_silent_connection_is_closed_after_head_timeout(tern_factory):
    tern = tern_factory("--head-timeout", "300")
    s = tern.connect()
    t0 = time.monotonic()
    assert recv_until_closed(s, 5) == b""
    assert time.monotonic() - t0 < 2.5 * SLOW


def test_slow_body_gets_408(tern_factory):
    tern = tern_factory("--body-timeout", "300")
    s = tern.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    out = recv_until_closed(s, 5)
    assert status_of(out) == 408


def test_idle_keep_alive_is_closed(tern_factory):
    tern = tern_factory("--idle-timeout", "300")
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert body == b"pong"
    t0 = time.monotonic()
    assert recv_until_closed(s, 5) == b""
    assert 0.25 < time.monotonic() - t0 < 2.5 * SLOW


# ---- static files ---------------------------------------------------------

@pytest.fixture
def www(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("<h1>home</h1>")
    (root / "a.txt").write_text("alpha")
    (root / "big.bin").write_bytes(os.urandom(3 << 20))
    (root / "docs").mkdir()
    (root / "docs" / "index.html").write_text("docs")
    (root / "sub dir").mkdir()
    (root / "sub dir" / "f.css").write_text("body{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (root / "escape").symlink_to(secret)
    (root / "inside").symlink_to(root / "a.txt")
    locked = root / "locked.txt"
    locked.write_text("no")
    locked.chmod(0)
    return root


def test_static_files(tern_factory, www):
    tern = tern_factory("--root", str(www))
    r, d = get(tern, "/a.txt")
    assert r.status == 200 and d == b"alpha"
    assert r.getheader("Content-Type").startswith("text/plain")
    assert r.getheader("Last-Modified")
    r, d = get(tern, "/")
    assert r.status == 200 and d == b"<h1>home</h1>"
    assert r.getheader("Content-Type").startswith("text/html")
    r, d = get(tern, "/big.bin")
    assert d == (www / "big.bin").read_bytes()
    r, d = get(tern, "/sub%20dir/f.css")
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/css")
    r, d = get(tern, "/docs")
    assert r.status == 301 and r.getheader("Location") == "/docs/"
    r, d = get(tern, "/docs/")
    assert d == b"docs"
    r, d = get(tern, "/inside")
    assert r.status == 200 and d == b"alpha"
    r, d = get(tern, "/missing")
    assert r.status == 404
    r, d = get(tern, "/ping")   # routes win over files
    assert d == b"pong"


def test_static_no_escape_from_root(tern_factory, www):
    tern = tern_factory("--root", str(www))
    for path in ["/escape", "/../secret.txt", "/%2e%2e/secret.txt", "/docs/../../secret.txt",
                 "/%2E%2E%2Fsecret.txt"]:
        out = raw(tern, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert status_of(out) in (403, 404), (path, out)
        assert b"secret" not in out.partition(b"\r\n\r\n")[2]


def test_static_forbidden_file(tern_factory, www):
    if os.geteuid() == 0:
        pytest.skip("root reads mode-0 files")
    tern = tern_factory("--root", str(www))
    r, _ = get(tern, "/locked.txt")
    assert r.status == 403


def test_static_fifo_is_403_and_does_not_block(tern_factory, www):
    # Opening a FIFO for reading blocks until a writer comes: the server
    # must neither hang on it nor serve it.
    os.mkfifo(www / "pipe")
    tern = tern_factory("--root", str(www))
    r, _ = get(tern, "/pipe")
    assert r.status == 403
    r, d = get(tern, "/a.txt")
    assert d == b"alpha"


def test_static_if_modified_since_gives_304(tern_factory, www):
    tern = tern_factory("--root", str(www))
    r, _ = get(tern, "/a.txt")
    lm = r.getheader("Last-Modified")
    r, d = get(tern, "/a.txt", headers={"If-Modified-Since": lm})
    assert r.status == 304 and d == b""
    r, d = get(tern, "/a.txt", headers={"If-Modified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"})
    assert r.status == 200


def test_static_head_and_pipelined_files(tern_factory, www):
    tern = tern_factory("--root", str(www))
    s = tern.connect()
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\nHEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert body == (www / "big.bin").read_bytes()
    st, h, body, rest = read_response_from(s, rest, for_head=True)
    assert st == 200 and h["content-length"] == "5"
    assert rest == b"" or rest.startswith(b"HTTP/1.1 200")
    st, h, body, rest = read_response_from(s, rest)
    assert body == b"alpha"
    s.close()


# ---- listeners -------------------------------------------------------------

def test_unix_socket(tern_factory, tmp_path):
    path = str(tmp_path / "tern.sock")
    tern = tern_factory("--unix", path)
    out = subprocess.run(["curl", "-sS", "--unix-socket", path, "http://x/ping"],
                         capture_output=True, check=True, timeout=10).stdout
    assert out == b"pong"


def test_ipv6_listener(tmp_path):
    from conftest import TERN_BIN
    import re
    p = subprocess.Popen([TERN_BIN, "serve", "--host", "::1", "--port", "0",
                          "--admin-listen", "off"], stderr=subprocess.PIPE)
    try:
        line = p.stderr.readline().decode()
        m = re.search(r":(\d+)/", line)
        assert m, line
        out = subprocess.run(["curl", "-sS", f"http://[::1]:{m.group(1)}/ping"],
                             capture_output=True, check=True, timeout=10).stdout
        assert out == b"pong"
    finally:
        p.terminate()
        assert p.wait(10) == 0


# ---- shutdown and resources -------------------------------------------------

def test_graceful_shutdown_finishes_requests_in_flight(tern_factory):
    tern = tern_factory()
    idle = tern.connect()
    idle.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(idle)
    busy = tern.connect()
    busy.sendall(b"GET /delay?ms=500 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    tern.proc.send_signal(15)
    st, h, body, rest = read_response(busy)
    assert st == 200 and body == b"done\n"
    assert h.get("connection") == "close"
    assert recv_until_closed(idle) == b""
    assert tern.proc.wait(10 * SLOW) == 0
    with pytest.raises(OSError):
        socket.create_connection((tern.host, tern.port), timeout=1)


def test_graceful_shutdown_under_load_loses_no_response(tern_factory):
    tern = tern_factory()
    results = {"ok": 0, "bad": 0, "refused": 0}
    stop = threading.Event()
    lock = threading.Lock()

    def client():
        while not stop.is_set():
            try:
                s = socket.create_connection((tern.host, tern.port), timeout=5)
            except OSError:
                with lock:
                    results["refused"] += 1
                return
            try:
                try:
                    s.sendall(b"GET /echo?size=100 HTTP/1.1\r\nHost: x\r\n\r\n")
                    st, h, body, rest = read_response(s)
                except (EOFError, ConnectionResetError, BrokenPipeError):
                    # Accepted but not yet read when shutdown began: the
                    # server may close it unanswered only if no byte of the
                    # request was read; the client retries elsewhere.
                    with lock:
                        results["refused"] += 1
                    return
                with lock:
                    if st == 200 and body == b"x" * 100:
                        results["ok"] += 1
                    else:
                        results["bad"] += 1
            finally:
                s.close()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    tern.proc.send_signal(15)
    for t in threads:
        t.join(15)
    stop.set()
    assert tern.proc.wait(10 * SLOW) == 0
    assert results["ok"] > 50
    assert results["bad"] == 0


def test_10000_connections_rss_returns_to_start(tern):
    # Warm up allocator arenas and the read path first.
    for _ in range(200):
        s = tern.connect()
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(s)
        s.close()
    time.sleep(0.2)
    start = tern.rss_kib()
    fds0 = tern.open_fds()
    batch = []
    for i in range(10000):
        s = tern.connect()
        if i % 2 == 0:
            s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            read_response(s)
        batch.append(s)
        if len(batch) == 500:
            for b in batch:
                b.close()
            batch = []
    for b in batch:
        b.close()
    deadline = time.monotonic() + 10
    while tern.open_fds() > fds0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tern.open_fds() == fds0
    end = tern.rss_kib()
    # Peak was 500 connections; afterwards the heap must be back near the start.
    # Under ASan freed memory sits in its quarantine, so RSS says nothing
    # there; LeakSanitizer checks the same thing at exit instead.
    if not SANITIZED:
        assert end - start < 2048, (start, end)


# ---- methods and versions (RFC 9110 §9.1, RFC 9112 §2.3) -----------------------

def test_unknown_method_is_501_known_but_not_allowed_is_405(tern):
    assert status_of(raw(tern, b"BREW /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 501
    assert status_of(raw(tern, b"BREW /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 501
    out = raw(tern, b"DELETE /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(out) == 405
    assert b"\r\nAllow: GET, HEAD\r\n" in out


def test_not_found_handler_takes_unknown_paths_but_not_405(tern):
    r, body = get(tern, "/no/such/thing")
    assert r.status == 404
    assert body == b"tern: no route for /no/such/thing\n"
    r, _ = get(tern, "/echo", method="DELETE")
    assert r.status == 405
    assert r.getheader("Allow") == "GET, HEAD, POST"


@pytest.mark.parametrize("version", [b"1.2", b"1.9"])
def test_higher_http_1_minor_is_served_as_1_1(tern, version):
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/" + version + b"\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert st == 200 and body == b"pong"
    s.settimeout(5)
    while b"pong" not in rest:
        rest += s.recv(4096)
    assert rest.startswith(b"HTTP/1.1 200 ")   # kept alive, as 1.1
    s.close()


@pytest.mark.parametrize("version", [b"2.0", b"3.0", b"0.9"])
def test_other_major_versions_are_505(tern, version):
    assert status_of(raw(tern, b"GET /ping HTTP/" + version + b"\r\nHost: x\r\n\r\n")) == 505


# ---- request accessors ---------------------------------------------------------

@pytest.mark.parametrize("id,status,text", [
    ("42", 200, b"id 42 from 127.0.0.1:"),
    ("-9223372036854775808", 200, b"id -9223372036854775808 from "),
    ("9223372036854775808", 400, b"id out of range\n"),
    ("4x", 400, b"id must be an integer\n"),
    ("-", 400, b"id must be an integer\n"),
])
def test_numeric_route_parameter_and_peer(tern, id, status, text):
    r, body = get(tern, "/item/" + id)
    assert r.status == status
    assert body.startswith(text), body


def test_peer_over_a_unix_socket(tern_factory, tmp_path):
    path = str(tmp_path / "t.sock")
    tern_factory("--unix", path)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"GET /item/7 HTTP/1.1\r\nHost: x\r\n\r\n")
    st, _, body, _ = read_response(s)
    assert st == 200 and body == b"id 7 from unix:\n"
    s.close()
