"""WebSocket behaviour of `tern serve`'s /ws echo route, with Python's
`websockets` and `aiohttp` clients and with raw frames on a socket for what
no well-behaved client will send."""
import asyncio
import base64
import os
import signal
import socket
import struct
import time

import aiohttp
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import SLOW, read_response


def ws_url(tern, path="/ws"):
    return f"ws://{tern.host}:{tern.port}{path}"


# ---- raw frames -------------------------------------------------------------

def handshake(tern, extra=b""):
    s = tern.connect()
    key = base64.b64encode(os.urandom(16))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n")
    st, h, body, rest = read_response(s)
    assert st == 101, (st, h)
    return s, h, rest


def frame(opcode, payload=b"", fin=True, mask=True, rsv=0):
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    n = len(payload)
    if n < 126:
        hdr = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
    else:
        hdr = struct.pack("!BBQ", b0, (0x80 if mask else 0) | 127, n)
    if not mask:
        return hdr + payload
    key = os.urandom(4)
    return hdr + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


class FrameReader:
    def __init__(self, sock, pending=b""):
        self.s, self.buf = sock, pending

    def _need(self, n, timeout):
        self.s.settimeout(timeout)
        while len(self.buf) < n:
            b = self.s.recv(65536)
            if not b:
                raise EOFError("closed")
            self.buf += b

    def read(self, timeout=5.0):
        """Returns (fin, opcode, payload) of the next server frame."""
        self._need(2, timeout)
        b0, b1 = self.buf[0], self.buf[1]
        assert not b1 & 0x80, "server frames must not be masked"
        n, off = b1 & 0x7F, 2
        if n == 126:
            self._need(4, timeout)
            n, off = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10, timeout)
            n, off = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(off + n, timeout)
        payload = self.buf[off:off + n]
        self.buf = self.buf[off + n:]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def closed(self, timeout=5.0):
        """True when the server closes TCP with nothing more to read."""
        try:
            self._need(len(self.buf) + 1, timeout)
        except (EOFError, ConnectionResetError):
            return True
        return False


def expect_close(r, code):
    fin, op, payload = r.read()
    assert op == 8, (op, payload)
    got = struct.unpack("!H", payload[:2])[0]
    assert got == code, (got, payload)
    assert r.closed(), "server must close TCP after the closing handshake"


# ---- echo with real clients ------------------------------------------------

@pytest.mark.parametrize("compression", ["deflate", None])
def test_echo_text_and_binary(tern, compression):
    with connect(ws_url(tern), compression=compression, max_size=None) as ws:
        negotiated = [e.name for e in ws.protocol.extensions]
        assert negotiated == (["permessage-deflate"] if compression else [])
        for msg in ["", "hello", "héllo ✓ 🚀", "x" * 125, "y" * 126, "z" * 65536]:
            ws.send(msg)
            assert ws.recv() == msg
        for n in [0, 1, 125, 126, 65535, 65536, 1 << 20]:
            data = os.urandom(n)
            ws.send(data)
            assert ws.recv() == data


def test_fragmented_message_is_echoed_whole(tern):
    with connect(ws_url(tern), compression=None) as ws:
        ws.send(["part one, ", "part two, ", "part three"])
        assert ws.recv() == "part one, part two, part three"
        ws.send([b"\x00" * 70000, b"\x01" * 3, b""])
        assert ws.recv() == b"\x00" * 70000 + b"\x01" * 3


def test_compressed_fragmented_and_context_takeover(tern):
    # Repeated text compresses across messages (context takeover both ways).
    with connect(ws_url(tern), compression="deflate") as ws:
        for i in range(50):
            msg = f"market tick {i} " * 40
            ws.send(msg)
            assert ws.recv() == msg
        ws.send(["compressed ", "fragments"])
        assert ws.recv() == "compressed fragments"


def test_many_concurrent_clients(tern):
    async def client(i):
        async with __import__("websockets").connect(ws_url(tern)) as ws:
            for j in range(50):
                msg = f"{i}:{j}"
                await ws.send(msg)
                assert await ws.recv() == msg

    async def main():
        await asyncio.gather(*(client(i) for i in range(100)))

    asyncio.run(asyncio.wait_for(main(), 60 * SLOW))


def test_aiohttp_client(tern):
    async def main():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(tern), compress=15) as ws:
                await ws.send_str("from aiohttp")
                assert (await ws.receive_str()) == "from aiohttp"
                await ws.send_bytes(b"\x00\xff" * 5000)
                assert (await ws.receive_bytes()) == b"\x00\xff" * 5000
                await ws.close(code=4001, message=b"bye")
                assert ws.close_code == 4001

    asyncio.run(asyncio.wait_for(main(), 20))


def test_close_code_is_echoed(tern):
    with connect(ws_url(tern)) as ws:
        ws.close(code=4321, reason="done here")
        assert ws.protocol.close_rcvd.code == 4321


# ---- limits and refusals -----------------------------------------------------

def test_message_over_limit_is_closed_1009(tern_factory):
    tern = tern_factory("--ws-max-message", "1000")
    with connect(ws_url(tern), compression=None) as ws:
        ws.send("a" * 1000)
        assert ws.recv() == "a" * 1000
        ws.send("a" * 1001)
        with pytest.raises(ConnectionClosed) as e:
            ws.recv()
        assert e.value.rcvd.code == 1009


def test_fragmented_message_over_limit_is_closed_1009(tern_factory):
    tern = tern_factory("--ws-max-message", "1000")
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    s.sendall(frame(2, b"x" * 600, fin=False) + frame(0, b"x" * 600, fin=True))
    expect_close(r, 1009)


def test_compressed_bomb_is_closed_1009(tern_factory):
    # 10 MB of zeros deflate to ~10 KB: the limit applies to the inflated size.
    import zlib
    tern = tern_factory("--ws-max-message", "100000")
    s, h, rest = handshake(tern, b"Sec-WebSocket-Extensions: permessage-deflate\r\n")
    assert "permessage-deflate" in h["sec-websocket-extensions"]
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = c.compress(b"\0" * 10_000_000) + c.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    r = FrameReader(s, rest)
    s.sendall(frame(2, data[:-4], rsv=4))
    expect_close(r, 1009)


def test_invalid_utf8_is_closed_1007(tern):
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    s.sendall(frame(1, b"ok \xff\xfe"))
    expect_close(r, 1007)


def test_utf8_split_across_fragments_is_valid(tern):
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    snowman = "☃".encode()
    s.sendall(frame(1, b"a" + snowman[:1], fin=False) + frame(0, snowman[1:] + b"b"))
    assert r.read() == (True, 1, b"a" + snowman + b"b")


@pytest.mark.parametrize("bad", [
    pytest.param(lambda: frame(1, b"hi", mask=False), id="unmasked"),
    pytest.param(lambda: frame(3, b"x"), id="reserved-opcode"),
    pytest.param(lambda: frame(1, b"x", rsv=2), id="rsv2-set"),
    pytest.param(lambda: frame(1, b"x", rsv=4), id="rsv1-without-deflate"),
    pytest.param(lambda: frame(0, b"x"), id="continuation-of-nothing"),
    pytest.param(lambda: frame(9, b"p", fin=False), id="fragmented-ping"),
    pytest.param(lambda: frame(9, b"p" * 126), id="ping-over-125"),
    pytest.param(lambda: frame(1, b"a", fin=False) + frame(1, b"b"), id="new-message-inside-fragmented"),
    pytest.param(lambda: frame(8, b"\x03\xe8"[:1]), id="close-1-byte"),
    pytest.param(lambda: frame(8, struct.pack("!H", 1005)), id="close-code-1005"),
    pytest.param(lambda: frame(8, struct.pack("!H", 999)), id="close-code-999"),
])
def test_protocol_errors_are_closed_1002(tern, bad):
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    s.sendall(bad())
    expect_close(r, 1002)


def test_ping_gets_pong_with_same_payload(tern):
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    # A ping between the fragments of a message is answered at once.
    s.sendall(frame(1, b"frag", fin=False) + frame(9, b"are you there") + frame(0, b"ment"))
    assert r.read() == (True, 10, b"are you there")
    assert r.read() == (True, 1, b"fragment")
    s.sendall(frame(8, struct.pack("!H", 1000)))
    expect_close(r, 1000)


def test_idle_connection_is_pinged(tern_factory):
    tern = tern_factory("--ws-idle-timeout", "300")
    s, h, rest = handshake(tern)
    r = FrameReader(s, rest)
    t0 = time.monotonic()
    fin, op, payload = r.read(timeout=5)
    assert op == 9
    assert 0.25 <= time.monotonic() - t0 < 3 * SLOW
    s.sendall(frame(10, payload))
    s.sendall(frame(1, b"still here"))
    assert r.read() == (True, 1, b"still here")


def test_handshake_refusals(tern):
    def ask(headers):
        s = tern.connect()
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        st, h, body, rest = read_response(s)
        s.close()
        return st, h

    up = b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    key = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    st, h = ask(up + key + b"Sec-WebSocket-Version: 8\r\n")
    assert st == 426 and h["sec-websocket-version"] == "13"
    st, h = ask(up + key)
    assert st == 400
    st, h = ask(up + b"Sec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n")
    assert st == 400
    # The RFC 6455 sample key gets the RFC's sample answer.
    s = tern.connect()
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n" + up + key + b"Sec-WebSocket-Version: 13\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert st == 101 and h["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    s.close()


def test_plain_get_on_ws_route_is_refused(tern):
    s = tern.connect()
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    st, h, body, rest = read_response(s)
    assert st == 426 and h.get("upgrade", "").lower() == "websocket"


# ---- shutdown ----------------------------------------------------------------

def test_graceful_shutdown_sends_1012(tern):
    """tern serve's drain invites clients back: 1012 (service restart); the
    library's default, 1001, is the unit tests'."""
    with connect(ws_url(tern)) as ws:
        ws.send("before")
        assert ws.recv() == "before"
        tern.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=5 * SLOW)
        assert e.value.rcvd.code == 1012
    assert tern.proc.wait(10 * SLOW) == 0


def test_many_connections_closed_abruptly_leave_nothing_behind(tern):
    fds0 = tern.open_fds()
    socks = []
    for i in range(300):
        s, h, rest = handshake(tern)
        s.sendall(frame(1, b"half a frame")[:5])
        socks.append(s)
    for s in socks:
        s.close()
    deadline = time.monotonic() + 10 * SLOW
    while tern.open_fds() > fds0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tern.open_fds() == fds0


# ---- the upgrade hook, subprotocols, prepared messages ---------------------

def test_subprotocol_is_negotiated(tern):
    with connect(ws_url(tern), subprotocols=["chat", "tern.echo"]) as ws:
        assert ws.subprotocol == "tern.echo"
        assert ws.response.headers["X-Tern-Connection"].isdigit()
    with connect(ws_url(tern), subprotocols=["chat"]) as ws:
        assert ws.subprotocol is None   # none agreed: the header is left out


def test_origin_check_refuses_other_origins(tern_factory):
    tern = tern_factory("--ws-origin", "https://good.example")
    with connect(ws_url(tern), origin="https://good.example") as ws:
        ws.send("hi")
        assert ws.recv() == "hi"
    from websockets.exceptions import InvalidStatus
    with pytest.raises(InvalidStatus) as e:
        with connect(ws_url(tern), origin="https://evil.example"):
            pass
    assert e.value.response.status_code == 403
    # Non-browser clients send no Origin and are let in.
    s, h, rest = handshake(tern)
    s.close()


def test_broadcast_reaches_every_connection_compressed_once(tern):
    from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
    import contextlib
    url = ws_url(tern, "/ws/broadcast")
    with contextlib.ExitStack() as stack:
        clients = [
            stack.enter_context(connect(url, compression="deflate")),
            stack.enter_context(connect(url, compression=None)),
            stack.enter_context(connect(url, compression=None, extensions=[
                ClientPerMessageDeflateFactory(client_max_window_bits=10)])),
        ]
        exts = [c.response.headers.get("Sec-WebSocket-Extensions", "") for c in clients]
        assert "server_no_context_takeover" in exts[0]
        assert "client_no_context_takeover" in exts[0]
        assert exts[1] == ""
        msg = "price update " * 200
        clients[1].send(msg)
        for c in clients:
            assert c.recv(timeout=5) == msg
        data = os.urandom(3000)
        clients[0].send(data)
        for c in clients:
            assert c.recv(timeout=5) == data
        # A member that leaves stops getting messages; the others go on.
        clients[2].close()
        clients[0].send("after leave")
        assert clients[0].recv(timeout=5) == "after leave"
        assert clients[1].recv(timeout=5) == "after leave"


def test_route_parameter_is_there_in_the_upgrade_hook(tern):
    # Issue #10: tern_http_param() inside on_upgrade gave NULL for "/ws/room/:room".
    s = tern.connect()
    key = base64.b64encode(os.urandom(16))
    s.sendall(b"GET /ws/room/lobby-7 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
              b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    st, h, _, _ = read_response(s)
    assert st == 101, (st, h)
    assert h.get("x-tern-room") == "lobby-7"
    s.close()
    with connect(ws_url(tern, "/ws/room/blue")) as ws:
        ws.send("hi")
        assert ws.recv(timeout=5) == "hi"
