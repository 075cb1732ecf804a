"""WebSocket over HTTP/2 (RFC 8441): `tern serve`'s TLS port offers
SETTINGS_ENABLE_CONNECT_PROTOCOL by ALPN h2, and its /ws and /pubsub
routes take an extended CONNECT (:protocol websocket) on a stream of the
connection. Driven by Python's h2 package over TLS, with the WebSocket
frames written here (client frames masked, RFC 6455 §5.3)."""
import json
import os
import socket
import ssl
import struct
import time
import zlib

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from conftest import SLOW, wait_for
from test_h2 import cert, h2_tern  # noqa: F401 (fixtures)


def frame(opcode, payload, fin=True, rsv1=False):
    """A client's frame: masked."""
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", b0, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", b0, 0x80 | 127, n)
    key = os.urandom(4)
    masked = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
    return head + key + masked


def parse_frames(buf):
    """The whole server frames at the start of buf (unmasked), and the rest."""
    out = []
    while len(buf) >= 2:
        b0, b1 = buf[0], buf[1]
        n, off = b1 & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                break
            n, off = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                break
            n, off = struct.unpack("!Q", buf[2:10])[0], 10
        if len(buf) < off + n:
            break
        out.append((b0 & 0x0F, bool(b0 & 0x40), buf[off:off + n]))
        buf = buf[off + n:]
    return out, buf


class H2TLS:
    """One TLS connection with ALPN h2 and its streams."""

    def __init__(self, tern, window=None):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((tern.host, tern.tls_port), timeout=10 * SLOW)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        cfg = h2.config.H2Configuration(client_side=True)
        self.conn = h2.connection.H2Connection(cfg)
        self.conn.initiate_connection()
        if window is not None:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.flush()
        self.events = []
        self.data = {}          # stream id -> bytes received, not yet parsed
        self.held = {}          # stream id -> bytes read but its window not opened
        self.read(lambda: self.remote_settings(), "the server's SETTINGS")

    def flush(self):
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def remote_settings(self):
        for e in self.events:
            if isinstance(e, h2.events.RemoteSettingsChanged):
                return e.changed_settings
        return None

    def read_once(self, timeout):
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        if not data:
            self.events.append("closed")
            return
        for ev in self.conn.receive_data(data):
            self.events.append(ev)
            if isinstance(ev, h2.events.DataReceived):
                self.data[ev.stream_id] = self.data.get(ev.stream_id, b"") + ev.data
                if ev.stream_id in self.held:
                    # the connection's window opens, this stream's not
                    self.held[ev.stream_id] += ev.flow_controlled_length
                    if ev.flow_controlled_length:
                        self.conn.increment_flow_control_window(ev.flow_controlled_length)
                else:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        self.flush()

    def read(self, until, what):
        deadline = time.monotonic() + 10 * SLOW
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.events}"
            assert "closed" not in self.events, f"closed before {what}: {self.events}"
            self.read_once(0.2)

    def of(self, kind, sid=None):
        return [e for e in self.events if isinstance(e, kind) and
                (sid is None or getattr(e, "stream_id", None) == sid)]

    def connect(self, path, version="13", protocol="websocket", extra=()):
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "CONNECT"), (":authority", "localhost")]
        if protocol is not None:   # else a plain CONNECT (RFC 9113 §8.5): no :scheme, :path
            headers += [(":protocol", protocol), (":scheme", "https"), (":path", path)]
        if version is not None:
            headers.append(("sec-websocket-version", version))
        headers.extend(extra)
        self.conn.send_headers(sid, headers)
        self.flush()
        return sid

    def response(self, sid):
        self.read(lambda: self.of(h2.events.ResponseReceived, sid) or
                  self.of(h2.events.StreamReset, sid), f"stream {sid}'s answer")
        got = self.of(h2.events.ResponseReceived, sid)
        assert got, f"stream {sid} reset: {self.events}"
        return dict((k.decode(), v.decode()) for k, v in got[0].headers)

    def open_ws(self, path, extra=()):
        sid = self.connect(path, extra=extra)
        head = self.response(sid)
        assert head[":status"] == "200", head
        return sid, head

    def send_ws(self, sid, data):
        """Sends data on the stream as the windows allow, reading meanwhile."""
        while data:
            self.read(lambda: self.conn.local_flow_control_window(sid) > 0,
                      f"stream {sid}'s window to open")
            room = min(self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size)
            self.conn.send_data(sid, data[:room])
            data = data[room:]
            self.flush()

    def messages(self, sid, count, what="messages"):
        got = []

        def have():
            frames, rest = parse_frames(self.data.get(sid, b""))
            self.data[sid] = rest
            got.extend(frames)
            return len(got) >= count
        self.read(have, what)
        return got


def test_settings_offer_extended_connect_and_echo_text_and_binary(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    assert c.remote_settings()[h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL].new_value == 1
    sid, head = c.open_ws("/ws")
    assert "sec-websocket-accept" not in head
    c.send_ws(sid, frame(1, b"hello over h2"))
    c.send_ws(sid, frame(2, bytes(range(256))))
    got = c.messages(sid, 2)
    assert got == [(1, False, b"hello over h2"), (2, False, bytes(range(256)))]
    # The close handshake: the server answers 1000 and ends its side.
    c.send_ws(sid, frame(8, struct.pack("!H", 1000)))
    (op, _, payload), = c.messages(sid, 1, "the close")
    assert op == 8 and payload[:2] == struct.pack("!H", 1000)
    c.read(lambda: c.of(h2.events.StreamEnded, sid), "the server's END_STREAM")
    c.conn.end_stream(sid)
    c.flush()
    # The connection serves on: a GET.
    g = c.conn.get_next_available_stream_id()
    c.conn.send_headers(g, [(":method", "GET"), (":path", "/ping"), (":scheme", "https"),
                            (":authority", "localhost")], end_stream=True)
    c.flush()
    c.read(lambda: c.of(h2.events.StreamEnded, g), "/ping's answer")
    assert c.data[g] == b"pong"


def test_permessage_deflate(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    sid, head = c.open_ws("/ws", extra=[("sec-websocket-extensions", "permessage-deflate")])
    assert head.get("sec-websocket-extensions", "").startswith("permessage-deflate"), head
    text = b"compress me " * 200
    co = zlib.compressobj(wbits=-15)
    body = co.compress(text) + co.flush(zlib.Z_SYNC_FLUSH)
    assert body.endswith(b"\x00\x00\xff\xff")
    c.send_ws(sid, frame(1, body[:-4], rsv1=True))
    (op, rsv1, payload), = c.messages(sid, 1)
    assert op == 1 and rsv1
    assert zlib.decompressobj(wbits=-15).decompress(payload + b"\x00\x00\xff\xff") == text


def test_chromiums_burst_every_echo_comes_back(h2_tern):
    # The burst of tests/clients/browser/ws.html, as Chromium sends it over
    # h2 (compressed, one context for the whole connection): the 70 000
    # random bytes outgrow the windows, so the client waits for the
    # server's WINDOW_UPDATE, then the empty message goes at once. Every
    # echo comes back, in order, the empty last one too (Chromium at
    # times never sends that one: test_ws_clients.py says why).
    tern = h2_tern()
    c = H2TLS(tern)
    sid, head = c.open_ws("/ws", extra=[("sec-websocket-extensions",
                                         "permessage-deflate; client_max_window_bits")])
    assert head.get("sec-websocket-extensions") == "permessage-deflate", head
    sends = [(1, "héllo ✓ 🚀".encode()), (1, b""), (1, ("ünïcödé ✓ 🚀 tern " * 5000).encode()),
             (2, bytes(range(256))), (2, os.urandom(70000)), (2, b"")]
    co = zlib.compressobj(wbits=-15)
    for op, data in sends:
        body = co.compress(data) + co.flush(zlib.Z_SYNC_FLUSH)
        c.send_ws(sid, frame(op, body[:-4], rsv1=True))
    dec = zlib.decompressobj(wbits=-15)
    got = [(op, dec.decompress(p + b"\x00\x00\xff\xff") if rsv1 else p)
           for op, rsv1, p in c.messages(sid, len(sends), "the six echoes")]
    assert got == sends


def test_pubsub_subscribe_and_publish_over_one_stream(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    sid, _ = c.open_ws("/pubsub")
    c.send_ws(sid, frame(1, json.dumps({"op": "subscribe", "topic": "t"}).encode()))
    (op, _, ack), = c.messages(sid, 1, "the subscribe's ack")
    assert json.loads(ack)["ok"] == "subscribe"
    c.send_ws(sid, frame(1, json.dumps({"op": "publish", "topic": "t", "data": "hi"}).encode()))
    got = [json.loads(p) for _, _, p in c.messages(sid, 2, "the publish and its delivery")]
    delivered = [m for m in got if m.get("topic") == "t" and "data" in m]
    assert delivered and delivered[0]["data"] == "hi", got


def test_two_websockets_and_a_get_on_one_connection(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    a, _ = c.open_ws("/ws")
    b, _ = c.open_ws("/ws")
    g = c.conn.get_next_available_stream_id()
    c.conn.send_headers(g, [(":method", "GET"), (":path", "/ping"), (":scheme", "https"),
                            (":authority", "localhost")], end_stream=True)
    c.send_ws(a, frame(1, b"to a"))
    c.send_ws(b, frame(1, b"to b"))
    assert c.messages(a, 1) == [(1, False, b"to a")]
    assert c.messages(b, 1) == [(1, False, b"to b")]
    c.read(lambda: c.of(h2.events.StreamEnded, g), "/ping's answer")
    assert c.data[g] == b"pong"


def test_reset_by_the_client_closes_the_websocket(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    a, _ = c.open_ws("/pubsub")
    b, _ = c.open_ws("/pubsub")
    for sid in (a, b):
        c.send_ws(sid, frame(1, json.dumps({"op": "subscribe", "topic": "r"}).encode()))
        c.messages(sid, 1, "the subscribe's ack")
    # One TCP connection carries both.
    stats = tern.stats()["total"]
    assert stats["accepted"] == 1 and stats["connections"] == 1, stats
    assert stats["pubsub"]["subscriptions"] == 2, stats
    # b leaves by RST_STREAM: the server closes its WebSocket (on_close
    # drops its subscription) and the connection serves on.
    c.conn.reset_stream(b)
    c.flush()
    wait_for(lambda: tern.stats()["total"]["pubsub"]["subscriptions"] == 1,
             "b's subscription gone")
    assert tern.stats()["total"]["connections"] == 1
    c.send_ws(a, frame(1, json.dumps({"op": "publish", "topic": "r", "data": "x"}).encode()))
    got = [json.loads(p) for _, _, p in c.messages(a, 2, "the publish and its delivery")]
    assert any(m.get("data") == "x" for m in got), got
    assert not c.data.get(b)


def test_a_message_larger_than_the_windows(h2_tern):
    # Both directions beyond the 64 KiB windows: the server's answer
    # waits on the window this client opens only as it reads.
    tern = h2_tern()
    c = H2TLS(tern)
    sid, _ = c.open_ws("/ws")
    big = os.urandom(300 * 1024)
    c.send_ws(sid, frame(2, big))
    (op, _, payload), = c.messages(sid, 1, "the echo of 300 KiB")
    assert op == 2 and payload == big


def test_a_stream_whose_window_stays_shut_holds_only_itself(h2_tern):
    # The client reads a's DATA but keeps a's window shut: a's answer
    # stops at the stream's window (its rest waits in the server's
    # backlog for that WebSocket), b is served meanwhile, and a's answer
    # completes once its window opens.
    tern = h2_tern()
    c = H2TLS(tern)
    a, _ = c.open_ws("/ws")
    b, _ = c.open_ws("/ws")
    c.held[a] = 0
    big = os.urandom(200 * 1024)
    c.send_ws(a, frame(2, big))
    c.read(lambda: c.held[a] >= 65535 - 1024, "a's window filled")
    c.send_ws(b, frame(1, b"b goes on"))
    assert c.messages(b, 1) == [(1, False, b"b goes on")]
    assert len(c.data[a]) < len(big)
    del c.held[a]
    c.conn.increment_flow_control_window(1 << 20, a)
    c.flush()
    (op, _, payload), = c.messages(a, 1, "the rest of a's answer")
    assert op == 2 and payload == big


def test_refusals(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    # A CONNECT without :protocol is a plain CONNECT: refused, at once.
    sid = c.connect("/ws", protocol=None)
    head = c.response(sid)
    assert head[":status"].startswith("4"), head
    # A version other than 13: 426 naming 13; none: 400.
    sid = c.connect("/ws", version="8")
    head = c.response(sid)
    assert head[":status"] == "426" and head["sec-websocket-version"] == "13"
    sid = c.connect("/ws", version=None)
    assert c.response(sid)[":status"] == "400"
    # Not a WebSocket path: 404.
    sid = c.connect("/nowhere")
    assert c.response(sid)[":status"] == "404"
    # The connection serves on.
    sid, _ = c.open_ws("/ws")
    c.send_ws(sid, frame(1, b"ok"))
    assert c.messages(sid, 1) == [(1, False, b"ok")]
