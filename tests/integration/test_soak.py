"""A soak: a seeded random mix of well-formed and abusive clients against
one `tern serve`, for a bounded time, on 127.0.0.1 (issue #11).

Every answer is checked (status, the headers that matter, body bytes). At the
end the server must hold exactly the descriptors it held after start, its
anonymous memory must be back within a few MiB of a baseline taken after a
warm-up (not under the sanitizers), and it must still answer /ping; the
fixture then checks it exits 0 on SIGTERM with no sanitizer report.

  TERN_SOAK_SECONDS   length of the main run (default 45; 20 under SANITIZED)
  TERN_SOAK_SEED      the seed (default 11); printed, with each failing
                      operation's own seed, so a failure can be replayed
  TERN_SOAK_CLIENTS   concurrent client tasks (default 24)
  TERN_SOAK_ONLY      comma-separated kinds: run only those (for reproducing)
"""
import asyncio
import base64
import collections
import hashlib
import os
import random
import socket
import struct
import time
import zlib

from conftest import SANITIZED, SLOW

SECONDS = float(os.environ.get("TERN_SOAK_SECONDS") or (20 if SANITIZED else 45))
SEED = int(os.environ.get("TERN_SOAK_SEED") or 11)
CLIENTS = int(os.environ.get("TERN_SOAK_CLIENTS") or 24)
ONLY = [k for k in (os.environ.get("TERN_SOAK_ONLY") or "").split(",") if k]
MAX_OPS = 200000            # a bound on iterations besides the clock
WARMUP = 4.0                # seconds of the mix before the memory baseline
OP_TIMEOUT = 20.0 * SLOW    # any single operation longer than this is a hang

# Long enough for a well-formed client to beat them on a busy machine: the
# 24 clients share one Python event loop, and a head sent in 10 pieces 10 ms
# apart took over 500 ms there (each sleep overshoots while the other tasks
# run), so the server rightly answered 408 to a client the test thought
# well-formed; and a chunked upload of 3.5 KiB in 10 pieces 10 ms apart
# once took over 2 s to reach the server while the machine ran two CPU
# burners beside the suite (408 from a 2 s body timeout). The head and
# body timeouts are 5 s: a well-formed client's pieces are never that far
# apart. The kinds that test the timeouts themselves wait for them.
HEAD_TO, BODY_TO, IDLE_TO, SEND_TO, WS_IDLE_TO = 5000, 5000, 2000, 2000, 2000
MAX_HEAD, MAX_BODY, WS_MAX = 8192, 1 << 20, 1 << 20
SERVER_ARGS = ["--quiet",
               "--head-timeout", str(HEAD_TO), "--body-timeout", str(BODY_TO),
               "--idle-timeout", str(IDLE_TO), "--send-timeout", str(SEND_TO),
               "--ws-idle-timeout", str(WS_IDLE_TO), "--max-head", str(MAX_HEAD),
               "--max-body", str(MAX_BODY), "--ws-max-message", str(WS_MAX)]
# How late a timeout may fire (the loop is shared with 24 busy clients, and
# with other engineers' builds).
SLACK = 3.0 * SLOW


class Mismatch(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Mismatch(what)


def short(b, n=120):
    return repr(b[:n]) + (f"...({len(b)} bytes)" if len(b) > n else "")


# ---- checksums (POST /upload answers "BYTES SUM\n", sum = sum*31 + byte) ------

M32 = 0xFFFFFFFF


def csum(data, h=0):
    for b in data:
        h = (h * 31 + b) & M32
    return h


def csum_concat(h1, h2, len2):
    return (h1 * pow(31, len2, 1 << 32) + h2) & M32


def csum_repeat(block, k):
    """Checksum of block * k, by doubling."""
    hb, lb = csum(block), len(block)
    h, result_len = 0, 0
    cur_h, cur_len = hb, lb
    while k:
        if k & 1:
            h = csum_concat(h, cur_h, cur_len)
            result_len += cur_len
        cur_h = csum_concat(cur_h, cur_h, cur_len)
        cur_len *= 2
        k >>= 1
    return h


def upload_body(rng, n):
    """n bytes of a random block repeated plus a random tail, and their checksum."""
    if n == 0:
        return b"", 0
    blen = rng.randint(1, min(n, 8192))
    block = rng.randbytes(blen)
    k, tail = divmod(n, blen)
    tail_b = rng.randbytes(tail)
    return block * k + tail_b, csum_concat(csum_repeat(block, k), csum(tail_b), tail)


# ---- HTTP client pieces --------------------------------------------------------

class Conn:
    def __init__(self, r, w):
        self.r, self.w = r, w

    def write(self, data):
        self.w.write(data)

    async def send(self, data, pieces=1, rng=None, pause=0.0):
        """Sends data, split at random points into `pieces` writes."""
        if pieces <= 1 or len(data) < 2:
            self.w.write(data)
            await self.w.drain()
            return
        cuts = sorted(rng.sample(range(1, len(data)), min(pieces - 1, len(data) - 1)))
        prev = 0
        for c in cuts + [len(data)]:
            self.w.write(data[prev:c])
            await self.w.drain()
            prev = c
            if pause:
                await asyncio.sleep(pause)

    async def eof(self, timeout):
        """Reads to the end: returns the bytes before EOF (or reset), or None
        when the connection is still open after timeout."""
        got = b""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    b = await self.r.read(1 << 16)
                    if not b:
                        return got
                    got += b
        except TimeoutError:
            return None
        except (ConnectionResetError, BrokenPipeError):
            return got

    def rst(self):
        sock = self.w.get_extra_info("socket")
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.w.transport.abort()

    def close(self):
        self.w.transport.abort() if self.w.transport.is_closing() else self.w.close()


async def connect(port, rcvbuf=None):
    if rcvbuf is None:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return Conn(r, w)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
    r, w = await asyncio.open_connection(sock=s, limit=1 << 20)
    return Conn(r, w)


async def read_final_response(c):
    """The next final response, past interim ones: tern sends a half-closed
    client whose answer is pending a 100 Continue, to learn whether it is
    still there; a client skips a 1xx it did not ask for (RFC 9110, 15.2)."""
    while True:
        resp = await read_response(c)
        if resp[1] != 100:
            return resp


async def read_response(c, head_req=False):
    """One response: (version, status, headers lower-cased, body)."""
    head = await c.r.readuntil(b"\r\n\r\n")
    lines = head[:-4].decode("latin-1").split("\r\n")
    version, status = lines[0].split(" ", 2)[:2]
    headers = {}
    for l in lines[1:]:
        k, sep, v = l.partition(":")
        expect(sep, f"bad header line {l!r}")
        k = k.strip().lower()
        expect(k not in headers, f"header {k} twice")
        headers[k] = v.strip()
    status = int(status)
    if head_req or 100 <= status < 200 or status in (204, 304):
        return version, status, headers, b""
    if "content-length" in headers:
        expect("transfer-encoding" not in headers, "both Content-Length and Transfer-Encoding")
        body = await c.r.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            line = await c.r.readuntil(b"\r\n")
            size = int(line[:-2].split(b";")[0], 16)
            if size == 0:
                while (await c.r.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            expect(size > 0, "negative chunk")
            parts.append(await c.r.readexactly(size))
            expect(await c.r.readexactly(2) == b"\r\n", "chunk not followed by CRLF")
        body = b"".join(parts)
    else:
        body = await c.r.read(-1)
    return version, status, headers, body


def check_ok(resp, body, ctype=None, what=""):
    version, status, headers, got = resp
    expect(version == "HTTP/1.1", f"{what}: version {version}")
    expect(status == 200, f"{what}: status {status} body {short(got)}")
    if ctype is not None:
        expect(headers.get("content-type") == ctype,
               f"{what}: content-type {headers.get('content-type')!r}, want {ctype!r}")
    expect(got == body, f"{what}: body {short(got)}, want {short(body)}")


async def check_error_and_close(c, status, what, timeout=5.0 * SLOW):
    """An error answer with Connection: close, then the connection closes."""
    try:
        version, st, headers, body = await read_response(c)
    except (asyncio.IncompleteReadError, ConnectionResetError) as e:
        raise Mismatch(f"{what}: no {status} answer ({e!r})")
    expect(st == status, f"{what}: status {st}, want {status}: {short(body)}")
    expect(headers.get("connection", "").lower() == "close", f"{what}: no Connection: close")
    rest = await c.eof(timeout)
    expect(rest is not None, f"{what}: still open {timeout}s after the {status}")
    expect(rest == b"", f"{what}: bytes after the {status}: {short(rest)}")


def get(path, extra=b"", version=b"1.1"):
    return b"GET " + path + b" HTTP/" + version + b"\r\nHost: soak\r\n" + extra + b"\r\n"


def post(path, body, ctype=b"application/octet-stream", extra=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: soak\r\nContent-Type: " + ctype +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def chunked(rng, body, ext=False):
    out, i = [], 0
    while i < len(body):
        n = rng.randint(1, max(1, min(len(body) - i, rng.choice([7, 100, 4096, 70000]))))
        e = b";x=y" if ext and rng.random() < 0.3 else b""
        out.append(b"%x%s\r\n%s\r\n" % (n, e, body[i:i + n]))
        i += n
    return b"".join(out) + b"0\r\n\r\n"


def post_chunked(path, body_chunked, ctype=b"application/octet-stream"):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: soak\r\nContent-Type: " + ctype +
            b"\r\nTransfer-Encoding: chunked\r\n\r\n" + body_chunked)


def stream_body(chunks, size):
    return b"".join(bytes([ord("a") + i % 26]) * size for i in range(chunks))


def rand_size(rng, big=1 << 20):
    return rng.choice([0, 1, 2, rng.randint(3, 200), rng.randint(200, 5000),
                       rng.randint(5000, 70000), rng.randint(70000, big)])


# A request and the checker of its answer, for sequences and pipelines.
def rand_exchange(rng):
    k = rng.randrange(6)
    if k == 0:
        if rng.random() < 0.2:   # a GET with a body: the body is read and dropped
            body = rng.randbytes(rng.randint(0, 3000))
            return (b"GET /ping HTTP/1.1\r\nHost: soak\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body, lambda resp: check_ok(resp, b"pong", "text/plain", "GET with a body"))
        return get(b"/ping"), lambda resp: check_ok(resp, b"pong", "text/plain", "ping")
    if k == 1:
        n = rand_size(rng, 300000)
        return (get(b"/echo?size=%d" % n),
                lambda resp: check_ok(resp, b"x" * n, "application/octet-stream", f"echo?size={n}"))
    if k == 2:
        body = rng.randbytes(rand_size(rng, 300000))
        ct = rng.choice([b"application/octet-stream", b"text/plain", b"application/x-soak"])
        return (post(b"/echo", body, ct),
                lambda resp: check_ok(resp, body, ct.decode(), f"POST /echo {len(body)}"))
    if k == 3:
        body, h = upload_body(rng, rand_size(rng, 300000))
        req = (post(b"/upload", body) if rng.random() < 0.5
               else post_chunked(b"/upload", chunked(rng, body)))
        want = b"%d %d\n" % (len(body), h)
        return req, lambda resp: check_ok(resp, want, "text/plain", f"upload {len(body)}")
    if k == 4:
        ch, sz = rng.randint(0, 40), rng.choice([0, 1, 5, 100, 3000, 20000])
        want = stream_body(ch, sz)
        return (get(b"/stream?chunks=%d&size=%d" % (ch, sz)),
                lambda resp: check_ok(resp, want, None, f"stream {ch}x{sz}"))
    ms = rng.randint(0, 80)
    return get(b"/delay?ms=%d" % ms), lambda resp: check_ok(resp, b"done\n", "text/plain", "delay")


# ---- the well-formed HTTP kinds ----------------------------------------------------

async def k_sequence(rng, port):
    """A keep-alive connection: a few requests one after another."""
    c = await connect(port)
    for _ in range(rng.randint(1, 6)):
        req, check = rand_exchange(rng)
        await c.send(req, rng.choice([1, 1, 2, 5]), rng)
        check(await read_response(c))
    c.close()


async def k_ping(rng, port):
    c = await connect(port)
    await c.send(get(b"/ping"))
    check_ok(await read_response(c), b"pong", "text/plain", "ping")
    c.close()


async def k_pipeline(rng, port):
    c = await connect(port)
    ex = [rand_exchange(rng) for _ in range(rng.randint(2, 10))]
    await c.send(b"".join(r for r, _ in ex), rng.choice([1, 3, 20]), rng)
    for i, (_, check) in enumerate(ex):
        check(await read_response(c))
    c.close()


async def k_chunked_echo(rng, port):
    c = await connect(port)
    body = rng.randbytes(rand_size(rng, 400000))
    await c.send(post_chunked(b"/echo", chunked(rng, body, ext=True)), rng.choice([1, 4]), rng)
    check_ok(await read_response(c), body, "application/octet-stream", f"chunked echo {len(body)}")
    c.close()


async def k_upload(rng, port):
    """POST /upload with a body streamed in pieces: Content-Length (also 0 and
    none at all) or chunked."""
    c = await connect(port)
    n = rand_size(rng, MAX_BODY)
    body, h = upload_body(rng, n)
    mode = rng.choice(["length", "length", "chunked", "none"])
    if mode == "none":
        req, body, h = b"POST /upload HTTP/1.1\r\nHost: soak\r\n\r\n", b"", 0
    elif mode == "length":
        req = post(b"/upload", body)
    else:
        req = post_chunked(b"/upload", chunked(rng, body))
    await c.send(req, rng.choice([1, 3, 10]), rng, pause=rng.choice([0, 0, 0.01]))
    check_ok(await read_response(c), b"%d %d\n" % (len(body), h), "text/plain",
             f"upload {mode} {len(body)}")
    c.close()


async def k_stream(rng, port):
    c = await connect(port)
    ch, sz = rng.randint(0, 200), rng.choice([0, 1, 7, 512, 4096, 16384, 65536])
    await c.send(get(b"/stream?chunks=%d&size=%d" % (ch, sz)))
    resp = await read_response(c)
    expect(resp[2].get("transfer-encoding") == "chunked", f"stream: not chunked: {resp[2]}")
    check_ok(resp, stream_body(ch, sz), "application/octet-stream", f"stream {ch}x{sz}")
    c.close()


async def k_delay(rng, port):
    c = await connect(port)
    ms = rng.randint(0, 300)
    t0 = time.monotonic()
    await c.send(get(b"/delay?ms=%d" % ms))
    check_ok(await read_response(c), b"done\n", "text/plain", f"delay {ms}")
    expect(time.monotonic() - t0 >= ms / 1000 - 0.01, f"delay {ms}: answered early")
    c.close()


async def k_http10(rng, port):
    """HTTP/1.0: answered, then closed."""
    c = await connect(port)
    k = rng.randrange(3)
    if k == 0:
        req, want = get(b"/ping", version=b"1.0"), b"pong"
    elif k == 1:
        n = rand_size(rng, 100000)
        req, want = get(b"/echo?size=%d" % n, version=b"1.0"), b"x" * n
    else:
        want = rng.randbytes(rand_size(rng, 100000))
        req = (b"POST /echo HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(want)) + want
    await c.send(req)
    resp = await read_response(c)
    check_ok(resp, want, None, "HTTP/1.0")
    expect(resp[2].get("connection", "").lower() == "close", "HTTP/1.0: no Connection: close")
    rest = await c.eof(5 * SLOW)
    expect(rest == b"", f"HTTP/1.0: not closed after the answer: {rest!r}")
    c.close()


async def k_misc(rng, port):
    """HEAD, 404, 405, 501, a bad query (400), keep-alive after each."""
    c = await connect(port)
    k = rng.randrange(5)
    if k == 0:
        n = rng.randint(0, 100000)
        await c.send(b"HEAD /echo?size=%d HTTP/1.1\r\nHost: soak\r\n\r\n" % n)
        v, st, h, body = await read_response(c, head_req=True)
        expect(st == 200 and h.get("content-length") == str(n), f"HEAD: {st} {h}")
    elif k == 1:
        name = b"/nope/%d" % rng.randint(0, 10**9)
        await c.send(get(name))
        v, st, h, body = await read_response(c)
        expect(st == 404 and body == b"tern: no route for " + name + b"\n", f"404: {st} {body!r}")
    elif k == 2:
        await c.send(b"DELETE /ping HTTP/1.1\r\nHost: soak\r\n\r\n")
        v, st, h, body = await read_response(c)
        expect(st == 405, f"405: {st} {body!r}")
    elif k == 3:
        await c.send(b"BREW /ping HTTP/1.1\r\nHost: soak\r\n\r\n")
        v, st, h, body = await read_response(c)
        expect(st == 501, f"501: {st} {body!r}")
    else:
        await c.send(get(b"/echo?size=-5"))
        v, st, h, body = await read_response(c)
        expect(st == 400 and body.startswith(b"size must be"), f"bad size: {st} {body!r}")
    if h.get("connection", "").lower() != "close":
        await c.send(get(b"/ping"))
        check_ok(await read_response(c), b"pong", "text/plain", "ping after misc")
    c.close()


async def k_continue(rng, port):
    """Expect: 100-continue: the interim answer, then the body, then the answer."""
    c = await connect(port)
    path = rng.choice([b"/echo", b"/upload"])
    body, h = upload_body(rng, rand_size(rng, 200000))
    await c.send(b"POST " + path + b" HTTP/1.1\r\nHost: soak\r\nExpect: 100-continue\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    v, st, hd, b = await read_response(c)
    if len(body) == 0 and st == 200:   # nothing to wait for: may answer at once
        resp = (v, st, hd, b)
    else:
        expect(st == 100, f"expect-continue {path!r} {len(body)}: status {st}, want 100")
        await c.send(body, rng.choice([1, 3]), rng)
        resp = await read_response(c)
    want = body if path == b"/echo" else b"%d %d\n" % (len(body), h)
    check_ok(resp, want, None, f"expect-continue {path!r} {len(body)}")
    c.close()


async def k_half_close_big(rng, port):
    """A request for a multi-MB answer, then a FIN: all of the answer comes."""
    c = await connect(port)
    if rng.random() < 0.5:
        n = rng.randint(1 << 20, 6 << 20)
        req, want = get(b"/echo?size=%d" % n), b"x" * n
    else:
        ch, sz = rng.randint(16, 100), 65536
        req, want = get(b"/stream?chunks=%d&size=%d" % (ch, sz)), stream_body(ch, sz)
    await c.send(req)
    c.w.write_eof()
    check_ok(await read_final_response(c), want, "application/octet-stream", "half-close, big answer")
    rest = await c.eof(5 * SLOW)
    expect(rest == b"", f"half-close big: after the answer {short(rest or b'')}")
    c.close()


async def k_fin_backlog(rng, port):
    """Many pipelined big answers asked for, then a FIN while the server has
    stopped reading (its backlog is full); read late: every answer comes, in
    order, then the close."""
    c = await connect(port, rcvbuf=rng.choice([None, 65536]))
    sizes = [rng.randint(100000, 1 << 20) for _ in range(rng.randint(8, 24))]
    await c.send(b"".join(get(b"/echo?size=%d" % n) for n in sizes))
    c.w.write_eof()
    await asyncio.sleep(rng.choice([0, 0.2, 0.5]))   # well under the send timeout
    for i, n in enumerate(sizes):
        check_ok(await read_final_response(c), b"x" * n, None, f"FIN with a backlog, answer {i}")
    rest = await c.eof(5 * SLOW)
    expect(rest == b"", f"FIN with a backlog: after the answers {short(rest or b'')}")
    c.close()


async def k_slow_reader(rng, port):
    """A multi-MB /stream read slowly but steadily: all of it arrives."""
    c = await connect(port, rcvbuf=rng.choice([16384, 65536]))
    sz = rng.choice([4096, 65536])
    ch = rng.randint(2 << 20, 4 << 20) // sz
    await c.send(get(b"/stream?chunks=%d&size=%d" % (ch, sz)))
    # Pace the reader: 32 KiB every 10 ms (about 3 MB/s), well within the
    # send timeout.
    orig_read = c.r.readexactly
    budget = [32768]

    async def slow_readexactly(n):
        parts = []
        while n:
            if budget[0] == 0:
                await asyncio.sleep(0.01)
                budget[0] = 32768
            k = min(n, budget[0])
            parts.append(await orig_read(k))
            n -= k
            budget[0] -= k
        return b"".join(parts)
    c.r.readexactly = slow_readexactly
    resp = await read_response(c)
    check_ok(resp, stream_body(ch, sz), "application/octet-stream", f"slow stream {ch}x{sz}")
    c.close()


async def k_idle_keepalive(rng, port):
    """A keep-alive connection left idle is closed after the idle timeout."""
    c = await connect(port)
    await c.send(get(b"/ping"))
    check_ok(await read_response(c), b"pong", "text/plain", "ping")
    t0 = time.monotonic()
    rest = await c.eof(IDLE_TO / 1000 + SLACK)
    expect(rest == b"", f"idle keep-alive: not closed ({rest!r}) after {time.monotonic() - t0:.2f}s")
    c.close()


# ---- the abusive HTTP kinds -----------------------------------------------------------

GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nBad Header\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"GET /ping HTTP/1.1\r\n Host: x\r\n\r\n",
    b"GET  /ping HTTP/1.1\r\nHost: x\r\n\r\n",
]


async def k_garbage(rng, port):
    c = await connect(port)
    g = rng.choice(GARBAGE)
    if rng.random() < 0.3:   # after a good request on the same connection
        await c.send(get(b"/ping"))
        check_ok(await read_response(c), b"pong", "text/plain", "ping before garbage")
    await c.send(g, rng.choice([1, 2]), rng)
    await check_error_and_close(c, 400, f"garbage {g[:40]!r}")
    c.close()


async def k_oversize_head(rng, port):
    c = await connect(port)
    if rng.random() < 0.5:
        req = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * rng.randint(MAX_HEAD, 3 * MAX_HEAD)
    else:
        req = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-H: v\r\n" * (MAX_HEAD // 8 + 10)
    await c.send(req[:MAX_HEAD + 100], rng.choice([1, 4]), rng)
    await check_error_and_close(c, 431, "oversize head")
    c.close()


async def k_oversize_body(rng, port):
    c = await connect(port)
    k = rng.randrange(3)
    if k == 0:   # told up front: refused before the body
        await c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                     % rng.randint(MAX_BODY + 1, 1 << 40))
        await check_error_and_close(c, 413, "Content-Length over max-body")
    else:        # chunked: refused once past the limit
        path = b"/echo" if k == 1 else b"/upload"
        body = b"z" * (MAX_BODY + rng.randint(1, 100000))
        c.write(post_chunked(path, chunked(rng, body))[:MAX_BODY + 200000])
        await check_error_and_close(c, 413, f"chunked over max-body to {path!r}")
    c.close()


async def k_stall(rng, port):
    """Stops mid-head or mid-body (or says nothing at all): cut after the timeout."""
    # The clock starts before the connect: the server's starts when it
    # accepts, which a busy client may learn of only later (0.44 s seen
    # for a 0.5 s timeout, under ASan, with the clock started after).
    t0 = time.monotonic()
    c = await connect(port)
    k = rng.randrange(4)
    if k == 0:
        await c.send(b"GET /ping HTTP/1.1\r\nHo")
        await check_error_and_close(c, 408, "stall mid-head", HEAD_TO / 1000 + SLACK)
    elif k == 1:
        n = rng.randint(10, 100000)
        await c.send(post(b"/echo", b"b" * n)[:-rng.randint(1, n)])
        await check_error_and_close(c, 408, "stall mid-body", BODY_TO / 1000 + SLACK)
    elif k == 2:
        n = rng.randint(10, 100000)
        await c.send(post(b"/upload", b"b" * n)[:-rng.randint(1, n)])
        await check_error_and_close(c, 408, "stall mid-upload", BODY_TO / 1000 + SLACK)
    else:
        rest = await c.eof(HEAD_TO / 1000 + SLACK)
        expect(rest == b"", f"silent client: {rest!r}")
    dt = time.monotonic() - t0
    expect(dt >= min(HEAD_TO, BODY_TO) / 1000 * 0.9, f"stall {k}: cut early, {dt:.2f}s")
    expect(dt <= max(HEAD_TO, BODY_TO) / 1000 + SLACK, f"stall {k}: cut late, {dt:.2f}s")
    c.close()


async def k_reset(rng, port):
    """A reset (SO_LINGER 0) mid-head, mid-body, mid-response or mid-delay."""
    c = await connect(port)
    k = rng.randrange(5)
    if k == 0:
        await c.send(b"GET /ping HTTP/1.1\r\nHo")
    elif k == 1:
        await c.send(post(b"/echo", b"a" * 100000)[:rng.randint(60, 50000)])
    elif k == 2:
        await c.send(post(b"/upload", b"a" * 100000)[:rng.randint(60, 50000)])
    elif k == 3:
        await c.send(get(b"/echo?size=%d" % rng.randint(1 << 20, 8 << 20)))
        await c.r.read(rng.randint(1, 100000))
    else:
        await c.send(get(b"/delay?ms=%d" % rng.randint(50, 500)))
    await asyncio.sleep(rng.choice([0, 0.005, 0.05]))
    c.rst()


async def k_half_close(rng, port):
    """Requests, then a FIN: answers to what can be answered at once still come."""
    c = await connect(port)
    ex = [rand_exchange(rng) for _ in range(rng.randint(1, 4))]
    ex = [(r, chk) for r, chk in ex if not r.startswith(b"GET /delay")] or [
        (get(b"/ping"), lambda resp: check_ok(resp, b"pong", "text/plain", "ping"))]
    await c.send(b"".join(r for r, _ in ex))
    c.w.write_eof()
    for _, check in ex:
        check(await read_final_response(c))
    rest = await c.eof(5 * SLOW)
    expect(rest == b"", f"half-close: after the answers {rest!r}")
    c.close()


async def k_delay_gone(rng, port):
    """Asks for /delay, then half-closes (the answer still comes) or resets
    before the answer."""
    c = await connect(port)
    await c.send(get(b"/delay?ms=%d" % rng.randint(200, 600)))
    await asyncio.sleep(rng.choice([0, 0.01, 0.1]))
    if rng.random() < 0.5:
        c.w.write_eof()   # a half-close: the pending answer still comes, then the end
        check_ok(await read_final_response(c), b"done\n", "text/plain", "FIN during /delay")
        rest = await c.eof(5 * SLOW)
        expect(rest == b"", f"FIN during /delay: after the answer {rest!r}")
        c.close()
    else:
        c.rst()


async def k_never_reads(rng, port):
    """Asks for a big response and never reads: cut after the send timeout
    (or it resets first, while the server waits on the backlog)."""
    c = await connect(port, rcvbuf=16384)
    # asyncio's transport would read on its own, up to twice the reader's
    # limit (2 MiB): on a busy event loop that trickles in for seconds,
    # each read rightly counted by the server as progress, so the cut
    # came after the test started reading. Nothing leaves the socket now.
    c.w.transport.pause_reading()
    n = 12 << 20
    if rng.random() < 0.3:
        await c.send(b"".join(get(b"/echo?size=%d" % (1 << 20)) for _ in range(40)))
        if rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0, SEND_TO / 1000))
            c.rst()
            return
    elif rng.random() < 0.5:
        await c.send(get(b"/echo?size=%d" % n))
    else:
        await c.send(get(b"/stream?chunks=%d&size=65536" % (n // 65536)))
    # Not a byte read until the server must have cut it (the send timeout
    # and the slack for a late timer on a busy machine), then whatever was
    # in the kernel's buffers and the end: never the whole body.
    await asyncio.sleep(SEND_TO / 1000 + SLACK)
    c.w.transport.resume_reading()
    rest = await c.eof(10 * SLOW)
    expect(rest is not None, "never-reader: still open long after the send timeout")
    expect(len(rest) < n, f"never-reader: got all {len(rest)} bytes, not cut")
    c.close()


# ---- WebSocket --------------------------------------------------------------------------

def frame(opcode, payload, fin=True, mask=True, rsv=0, mkey=None):
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv | opcode
    mbit = 0x80 if mask else 0
    if n < 126:
        hdr = struct.pack("!BB", b0, mbit | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", b0, mbit | 126, n)
    else:
        hdr = struct.pack("!BBQ", b0, mbit | 127, n)
    if not mask:
        return hdr + payload
    key = mkey if mkey is not None else os.urandom(4)
    if n:
        k = (key * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")
    return hdr + key + payload


async def ws_open(port, rng, path=b"/ws", extra=b"", first=b""):
    """Upgrades; `first` (frames) goes in the same write as the request."""
    c = await connect(port)
    key = base64.b64encode(rng.randbytes(16))
    await c.send(b"GET " + path + b" HTTP/1.1\r\nHost: soak\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
                 b"\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n" + first)
    v, st, h, body = await read_response(c)
    expect(st == 101, f"ws upgrade: {st} {body!r}")
    expect(h.get("upgrade", "").lower() == "websocket", f"ws upgrade headers {h}")
    want = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    expect(h.get("sec-websocket-accept", "").encode() == want, f"ws accept {h}")
    c.ws_ext = h.get("sec-websocket-extensions", "")
    return c


async def ws_read_frame(c):
    b0, b1 = await c.r.readexactly(2)
    expect(not (b1 & 0x80), "server frame masked")
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", await c.r.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await c.r.readexactly(8))[0]
    return b0 & 0x80, b0 & 0x70, b0 & 0x0F, await c.r.readexactly(n)


class Deflate:
    """permessage-deflate for the client side (context kept both ways)."""
    def __init__(self):
        self.z = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
        self.d = zlib.decompressobj(-15)

    def compress(self, data):
        out = self.z.compress(data) + self.z.flush(zlib.Z_SYNC_FLUSH)
        assert out.endswith(b"\x00\x00\xff\xff")
        return out[:-4]

    def decompress(self, data):
        return self.d.decompress(data + b"\x00\x00\xff\xff")


async def ws_read(c, pongs=None):
    """The next message (opcode, payload), or ('close', payload); answers the
    server's pings; pong payloads go to `pongs`."""
    op0, parts, compressed = None, [], False
    infl = getattr(c, "inflate", None)
    while True:
        fin, rsv, op, payload = await ws_read_frame(c)
        expect(rsv == 0 or (rsv == 0x40 and infl is not None and op in (1, 2)),
               f"ws: rsv bits {rsv:#x} on opcode {op}")
        if rsv:
            compressed = True
        if op == 9:
            c.write(frame(10, payload))
            continue
        if op == 10:
            if pongs is not None:
                pongs.append(payload)
            continue
        if op == 8:
            return "close", payload
        if op == 0:
            expect(op0 is not None, "ws: continuation without a start")
        else:
            expect(op0 is None and op in (1, 2), f"ws: opcode {op} (in a message: {op0})")
            op0 = op
        parts.append(payload)
        if fin:
            data = b"".join(parts)
            return op0, infl.decompress(data) if compressed else data


async def ws_expect_close(c, code, what):
    """Reads to the server's close frame: its code must be `code`; then the
    connection closes."""
    while True:
        try:
            op, payload = await ws_read(c)
        except (asyncio.IncompleteReadError, ConnectionResetError) as e:
            raise Mismatch(f"{what}: no close frame ({e!r})")
        if op == "close":
            break
    got = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
    expect(got == code, f"{what}: close code {got} {payload[2:]!r}, want {code}")
    try:
        c.write(frame(8, payload[:2]))
    except Exception:
        pass
    rest = await c.eof(8 * SLOW)
    expect(rest is not None, f"{what}: still open after the close")
    expect(rest == b"", f"{what}: bytes after the close frame {rest!r}")


def ws_text(rng, n):
    """About n bytes of valid UTF-8 (1- to 4-byte characters)."""
    base = "".join(rng.choice("aé€😀 z\n") for _ in range(min(n, 1000))).encode()
    if not base:
        return b""
    return (base * (n // len(base) + 1))[:n].decode("utf-8", "ignore").encode()


async def k_ws_echo(rng, port):
    """Echoes of random messages, some fragmented, with pings; some with
    permessage-deflate; some frames sent with the upgrade request; then
    mostly the close handshake."""
    deflate = rng.random() < 0.3
    first = b""
    if rng.random() < 0.2 and not deflate:
        first_msg = rng.randbytes(rng.randint(0, 300))
        first = frame(2, first_msg)
    c = await ws_open(port, rng, extra=b"Sec-WebSocket-Extensions: permessage-deflate\r\n"
                      if deflate else b"", first=first)
    if deflate:
        expect(c.ws_ext.startswith("permessage-deflate"), f"ws: no deflate: {c.ws_ext!r}")
        pmd = Deflate()
        c.inflate = pmd
    pongs = []
    if first:
        expect(await ws_read(c, pongs) == (2, first_msg), "ws: echo of a frame sent with the upgrade")
    for _ in range(rng.randint(1, 8)):
        op = rng.choice([1, 2])
        n = rand_size(rng, 400000)
        data = ws_text(rng, n) if op == 1 else rng.randbytes(n)
        ping_data = rng.randbytes(rng.randint(0, 125)) if rng.random() < 0.3 else None
        if deflate:
            wire = pmd.compress(data)
            if rng.random() < 0.3 and len(wire) > 1:
                cut = rng.randint(1, len(wire) - 1)
                c.write(frame(op, wire[:cut], fin=False, rsv=0x40))
                if ping_data is not None:
                    c.write(frame(9, ping_data))
                c.write(frame(0, wire[cut:]))
            else:
                if ping_data is not None:
                    c.write(frame(9, ping_data))
                c.write(frame(op, wire, rsv=0x40))
        elif rng.random() < 0.3 and len(data) > 1:   # fragmented, a ping in the middle
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 5))))
            pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
            for i, p in enumerate(pieces):
                c.write(frame(op if i == 0 else 0, p, fin=i == len(pieces) - 1))
                if i == 0 and ping_data is not None:
                    c.write(frame(9, ping_data))
                if rng.random() < 0.3:
                    await c.w.drain()
                    await asyncio.sleep(0.002)
        else:
            if ping_data is not None:
                c.write(frame(9, ping_data))
            c.write(frame(op, data))
        await c.w.drain()
        got_op, got = await ws_read(c, pongs)
        expect((got_op, got) == (op, data),
               f"ws echo: got {got_op} {short(got)} want {op} {short(data)}")
        if ping_data is not None:
            expect(pongs and pongs[-1] == ping_data, f"ws: pong {pongs[-1:]!r} want {ping_data!r}")
    if rng.random() < 0.8:   # the close handshake: the code comes back
        code = rng.choice([1000, 1001, 3000, rng.randint(3000, 4999)])
        reason = rng.choice([b"", b"bye", "fin ✓".encode()])
        c.write(frame(8, struct.pack("!H", code) + reason))
        await c.w.drain()
        while True:
            op, payload = await ws_read(c)
            if op == "close":
                break
        expect(payload[:2] == struct.pack("!H", code), f"ws close: {payload!r} want code {code}")
        rest = await c.eof(5 * SLOW)
        expect(rest == b"", f"ws close: not closed after the close frame: {rest!r}")
        c.close()
    elif rng.random() < 0.5:
        c.rst()
    else:
        c.close()


async def k_ws_idle(rng, port):
    """An idle WebSocket gets a ping after --ws-idle-timeout, and answering it
    keeps the connection; echoes still work."""
    c = await ws_open(port, rng)
    try:
        async with asyncio.timeout(WS_IDLE_TO / 1000 + SLACK):
            fin, rsv, op, payload = await ws_read_frame(c)
    except TimeoutError:
        raise Mismatch("ws idle: no ping")
    expect(op == 9, f"ws idle: frame {op} {payload!r}, want a ping")
    c.write(frame(10, payload))
    c.write(frame(2, b"still here"))
    await c.w.drain()
    expect(await ws_read(c) == (2, b"still here"), "ws idle: echo after the ping")
    c.rst()


async def k_ws_broadcast(rng, port):
    """Every message to every /ws/broadcast member: ours comes back among others'."""
    c = await ws_open(port, rng, b"/ws/broadcast")
    tag = b"bc:%d:" % rng.getrandbits(64)
    for i in range(rng.randint(1, 4)):
        msg = tag + b"%d:" % i + rng.randbytes(rng.randint(0, 3000))
        c.write(frame(2, msg))
        await c.w.drain()
        while True:
            op, got = await ws_read(c)
            expect(op == 2 and got.startswith(b"bc:"), f"broadcast: {op} {short(got)}")
            if got == msg:
                break
            expect(not got.startswith(tag), f"broadcast: ours garbled {short(got)}")
    c.rst() if rng.random() < 0.5 else c.close()


async def k_ws_abuse(rng, port):
    c = await ws_open(port, rng)
    k = rng.randrange(10)
    if k == 8:
        payload, code = rng.choice([(struct.pack("!H", 999), 1002), (struct.pack("!H", 1005), 1002),
                                    (struct.pack("!H", 1006), 1002), (b"\x03", 1002),
                                    (struct.pack("!H", 2000), 1002),
                                    (struct.pack("!H", 1000) + b"\xff\xfe", 1007)])
        c.write(frame(8, payload))
        await ws_expect_close(c, code, f"ws bad close frame {payload!r}")
    elif k == 9:
        c.write(frame(0, b"continuation first"))
        await ws_expect_close(c, 1002, "ws continuation without a start")
    elif k == 0:
        c.write(frame(2, b"no mask", mask=False))
        await ws_expect_close(c, 1002, "ws unmasked")
    elif k == 1:
        bad = rng.choice([b"\xff", b"ab\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"])
        c.write(frame(1, b"ok " + bad))
        await ws_expect_close(c, 1007, f"ws bad utf-8 {bad!r}")
    elif k == 2:   # bad UTF-8 across fragments
        c.write(frame(1, b"ok \xe2\x82", fin=False))
        c.write(frame(0, b"\x28", fin=True))
        await ws_expect_close(c, 1007, "ws bad utf-8 fragmented")
    elif k == 3:
        c.write(frame(rng.choice([3, 7, 11, 15]), b"x"))
        await ws_expect_close(c, 1002, "ws reserved opcode")
    elif k == 4:
        c.write(frame(2, b"x", rsv=0x20))
        await ws_expect_close(c, 1002, "ws rsv bit")
    elif k == 5:
        c.write(frame(9, b"p" * 126))
        await ws_expect_close(c, 1002, "ws ping over 125")
    elif k == 6:
        n = WS_MAX + rng.randint(1, 100000)
        c.write(frame(2, b"y" * n)[:n // 2 + 20])   # the header says too much
        await ws_expect_close(c, 1009, "ws message over max")
    else:          # reset mid-frame
        c.write(frame(2, b"z" * rng.randint(10, 100000))[:rng.randint(1, 9)])
        await c.w.drain()
        await asyncio.sleep(rng.choice([0, 0.01]))
        c.rst()
        return
    c.close()


async def k_ws_backlog(rng, port):
    """Sends a few MB of messages without reading (the echo pauses it), then
    reads: every echo, in order."""
    c = await ws_open(port, rng)
    msgs = [rng.randbytes(rng.randint(1, 65536)) for _ in range(rng.randint(20, 60))]

    async def send_all():
        for m in msgs:
            c.write(frame(2, m))
            await c.w.drain()
    sender = asyncio.create_task(send_all())
    await asyncio.sleep(rng.choice([0.1, 0.5]))
    for i, m in enumerate(msgs):
        op, got = await ws_read(c)
        expect((op, got) == (2, m), f"ws backlog: echo {i}: {op} {short(got)}")
    await sender
    c.rst() if rng.random() < 0.5 else c.close()


async def k_ws_stuck_member(rng, port):
    """A /ws/broadcast member that never reads (the drop policy); then it goes."""
    c = await connect(port, rcvbuf=4096)
    key = base64.b64encode(rng.randbytes(16))
    await c.send(b"GET /ws/broadcast HTTP/1.1\r\nHost: soak\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
                 b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    v, st, h, body = await read_response(c)
    expect(st == 101, f"stuck member: {st}")
    for _ in range(rng.randint(0, 20)):
        c.write(frame(2, b"bc:stuck:" + rng.randbytes(rng.randint(0, 60000))))
    await c.w.drain()
    await asyncio.sleep(rng.uniform(0.2, 2.0))
    c.rst()


async def k_ws_half_close(rng, port):
    c = await ws_open(port, rng)
    msg = rng.randbytes(rng.randint(0, 5000))
    c.write(frame(2, msg))
    c.w.write_eof()
    await c.w.drain()
    out = await c.eof(5 * SLOW)
    expect(out is not None, "ws half-close: not closed")
    expect(msg in out, f"ws half-close: echo missing from {short(out)}")
    c.close()


KINDS = {
    # well-formed
    "sequence": (k_sequence, 10), "ping": (k_ping, 6), "pipeline": (k_pipeline, 6),
    "chunked_echo": (k_chunked_echo, 4), "upload": (k_upload, 6), "stream": (k_stream, 4),
    "delay": (k_delay, 3), "continue": (k_continue, 2), "http10": (k_http10, 3), "misc": (k_misc, 3),
    "slow_reader": (k_slow_reader, 1), "idle_keepalive": (k_idle_keepalive, 1),
    "ws_echo": (k_ws_echo, 8), "ws_idle": (k_ws_idle, 1), "ws_broadcast": (k_ws_broadcast, 2),
    # abusive
    "garbage": (k_garbage, 3), "oversize_head": (k_oversize_head, 2),
    "oversize_body": (k_oversize_body, 2), "stall": (k_stall, 2), "reset": (k_reset, 4),
    "half_close": (k_half_close, 3), "half_close_big": (k_half_close_big, 1),
    "fin_backlog": (k_fin_backlog, 1), "ws_backlog": (k_ws_backlog, 1),
    "ws_stuck_member": (k_ws_stuck_member, 1), "delay_gone": (k_delay_gone, 2),
    "never_reads": (k_never_reads, 1), "ws_abuse": (k_ws_abuse, 5),
    "ws_half_close": (k_ws_half_close, 2),
}


async def run_mix(port, seed, seconds, stats, failures, tag):
    names = [k for k in KINDS if not ONLY or k in ONLY]
    weights = [KINDS[k][1] for k in names]
    master = random.Random(seed)
    deadline = time.monotonic() + seconds
    ops = 0

    async def worker(wid):
        nonlocal ops
        rng = random.Random(master.getrandbits(64))
        while time.monotonic() < deadline and ops < MAX_OPS and len(failures) < 20:
            ops += 1
            kind = rng.choices(names, weights)[0]
            op_seed = rng.getrandbits(32)
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(OP_TIMEOUT):
                    await KINDS[kind][0](random.Random(op_seed), port)
                stats[kind][0] += 1
            except Mismatch as e:
                stats[kind][1] += 1
                failures.append(f"[{tag}] {kind} (op seed {op_seed}): {e}")
            except TimeoutError:
                stats[kind][1] += 1
                failures.append(f"[{tag}] {kind} (op seed {op_seed}): no end in {OP_TIMEOUT}s")
            except Exception as e:   # a wrong close, a reset where none is due...
                stats[kind][1] += 1
                failures.append(f"[{tag}] {kind} (op seed {op_seed}): {e!r} after "
                                f"{time.monotonic() - t0:.2f}s")
            stats[kind][2] += time.monotonic() - t0

    async def lag_watch():
        # How long the clients' own event loop stalled (a 20 ms sleep that
        # took longer): every task here shares it, so a stall delays every
        # client's next write and read at once.
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            await asyncio.sleep(0.02)
            LAG[tag] = max(LAG.get(tag, 0.0), time.monotonic() - t0 - 0.02)

    await asyncio.gather(lag_watch(), *(worker(i) for i in range(CLIENTS)))


LAG = {}   # run_mix's tag: the longest stall of the clients' event loop (s)


def rss_anon_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def wait_fds_exact(tern, target, timeout):
    deadline = time.monotonic() + timeout
    while tern.open_fds() != target and time.monotonic() < deadline:
        time.sleep(0.05)
    return tern.open_fds()


def ping_ok(tern):
    s = tern.connect()
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5 * SLOW)
    got = b""
    while not got.endswith(b"pong"):
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    return got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\npong")


def test_soak(tern_factory):
    print(f"\nsoak: seed {SEED} (TERN_SOAK_SEED), {SECONDS:.0f}s (TERN_SOAK_SECONDS), "
          f"{CLIENTS} clients{', only ' + ','.join(ONLY) if ONLY else ''}")
    tern = tern_factory(*SERVER_ARGS)
    fds0 = tern.open_fds()
    stats = collections.defaultdict(lambda: [0, 0, 0.0])
    failures = []
    t_start = time.monotonic()

    asyncio.run(run_mix(tern.port, SEED ^ 0x5eed, min(WARMUP, SECONDS), stats, failures, "warm-up"))
    fds_w = wait_fds_exact(tern, fds0, 10 * SLOW)
    rss0 = rss_anon_kib(tern.proc.pid)
    asyncio.run(run_mix(tern.port, SEED, SECONDS, stats, failures, "soak"))
    t_mix = time.monotonic() - t_start
    fds1 = wait_fds_exact(tern, fds0, 10 * SLOW)
    rss1 = rss_anon_kib(tern.proc.pid)
    alive = tern.proc.poll() is None and ping_ok(tern)

    print(f"{'kind':<16}{'ok':>8}{'failed':>8}{'avg ms':>9}")
    for k in KINDS:
        if k in stats:
            ok, bad, t = stats[k]
            print(f"{k:<16}{ok:>8}{bad:>8}{1000 * t / max(1, ok + bad):>9.0f}")
    tot_ok = sum(v[0] for v in stats.values())
    tot_bad = sum(v[1] for v in stats.values())
    print(f"{'total':<16}{tot_ok:>8}{tot_bad:>8}   in {t_mix:.1f}s")
    print(f"descriptors: {fds0} at start, {fds_w} after warm-up, {fds1} at the end; "
          f"RssAnon {rss0} KiB after warm-up, {rss1} KiB at the end ({rss1 - rss0:+d} KiB)")
    print("the clients' longest stall: " + ", ".join(f"{t} {v * 1000:.0f} ms" for t, v in LAG.items()))
    for f in failures:
        print("FAIL", f)

    assert alive, "the server no longer answers /ping"
    assert not failures, f"{len(failures)} failures, first: {failures[0]}"
    assert fds_w == fds0, f"descriptors after warm-up {fds_w}, at start {fds0}"
    assert fds1 == fds0, f"descriptors at the end {fds1}, at start {fds0}"
    if not SANITIZED:
        assert rss1 - rss0 < 8 * 1024, f"RssAnon grew {rss1 - rss0} KiB"
