"""HTTP/2's attack limits, driven frame by frame (hyperframe, under
Python's h2): floods of SETTINGS, PING, PRIORITY and CONTINUATION frames,
an HPACK table grown past the size tern allows, a window held at zero and
an idle connection. Each ends with a GOAWAY naming why, or is shrugged
off with the connection serving on; none grows the server without bound."""
import socket
import struct
import time

import h2.errors
import hpack
import hyperframe.frame as hf
import pytest

from conftest import SLOW
from test_h2 import cert, h2_tern   # noqa: F401 (fixtures)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


class Raw:
    """A plain-port h2c connection that writes and reads raw frames."""

    def __init__(self, port, settings=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10 * SLOW)
        self.sock.sendall(PREFACE + hf.SettingsFrame(0, settings or {}).serialize())
        self.frames, self.buf, self.closed = [], b"", False
        self.enc = hpack.Encoder()

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # ended already: what it said is read next

    def headers_block(self, path, method="GET", extra=()):
        return self.enc.encode([(":method", method), (":path", path), (":scheme", "http"),
                                (":authority", "localhost"), *extra])

    def get(self, sid, path):
        f = hf.HeadersFrame(sid, self.headers_block(path))
        f.flags.add("END_HEADERS")
        f.flags.add("END_STREAM")
        self.send(f.serialize())

    def read_until(self, cond, what):
        deadline = time.monotonic() + 20 * SLOW
        while not cond():
            assert not self.closed, f"closed before {what}: {self.frames[-5:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.frames[-5:]}"
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                continue
            self.buf += data
            while len(self.buf) >= 9:
                f, n = hf.Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) < 9 + n:
                    break
                f.parse_body(memoryview(self.buf[9:9 + n]))
                self.buf = self.buf[9 + n:]
                self.frames.append(f)

    def seen(self, kind, sid=None):
        return [f for f in self.frames if isinstance(f, kind) and
                (sid is None or f.stream_id == sid)]

    def goaway(self):
        self.read_until(lambda: self.seen(hf.GoAwayFrame), "the GOAWAY")
        return self.seen(hf.GoAwayFrame)[0]

    def ends_closed(self):
        self.read_until(lambda: self.closed, "the close")
        self.sock.close()


def served_on(tern):
    """A fresh connection is answered: the server lives on."""
    c = Raw(tern.port)
    c.get(1, "/ping")
    c.read_until(lambda: any("END_STREAM" in f.flags for f in c.seen(hf.DataFrame, 1)),
                 "/ping's answer")
    assert b"".join(f.data for f in c.seen(hf.DataFrame, 1)) == b"pong"
    c.sock.close()


@pytest.mark.parametrize("frame", [
    hf.SettingsFrame(0).serialize(),
    hf.PingFrame(0, b"12345678").serialize(),
], ids=["settings", "ping"])
def test_a_flood_of_frames_to_acknowledge_ends_with_enhance_your_calm(h2_tern, frame):
    # Each SETTINGS or PING asks for an ACK. A peer that sends them and
    # reads nothing would grow the server's queue of answers: past 1000
    # unsent, the connection ends with ENHANCE_YOUR_CALM.
    tern = h2_tern("--http2", "h2c")
    c = Raw(tern.port)
    c.send(frame * 200000)
    end = c.goaway()
    assert end.error_code == CALM, end
    c.ends_closed()
    served_on(tern)


def test_too_many_settings_in_one_frame_end_the_connection(h2_tern):
    tern = h2_tern("--http2", "h2c")
    c = Raw(tern.port)
    # 64 entries (hyperframe keeps one per setting: the frame by hand);
    # tern takes 32 at most (nghttp2_option_set_max_settings).
    body = b"".join(struct.pack(">HI", 0x4, 65535) for _ in range(64))
    c.send(struct.pack(">I", len(body))[1:] + b"\x04\x00\x00\x00\x00\x00" + body)
    end = c.goaway()
    assert end.error_code == CALM, end
    c.ends_closed()


def test_a_priority_flood_is_shrugged_off(h2_tern):
    # PRIORITY frames ask no answer and open no stream: nghttp2 keeps a
    # bounded set of idle streams (or ignores them), and the connection
    # serves on.
    tern = h2_tern("--http2", "h2c")
    c = Raw(tern.port)
    c.send(b"".join(hf.PriorityFrame(2 * i + 1, depends_on=0, stream_weight=15).serialize()
                    for i in range(1, 100001)))
    c.get(200005, "/ping")
    c.read_until(lambda: any("END_STREAM" in f.flags for f in c.seen(hf.DataFrame, 200005)),
                 "/ping's answer")
    assert not c.seen(hf.GoAwayFrame)
    c.sock.close()


def test_a_continuation_flood_ends_with_a_goaway(h2_tern):
    # HEADERS without END_HEADERS, then CONTINUATION frames without end
    # (CVE-2024-27316 and its kin): nghttp2's bound on CONTINUATION frames
    # per header block ends the connection, before the fields pile up.
    tern = h2_tern("--http2", "h2c")
    c = Raw(tern.port)
    c.send(hf.HeadersFrame(1, c.headers_block("/ping")).serialize())
    block = hpack.Encoder().encode([("x-a", "b" * 100)])
    c.send(b"".join(hf.ContinuationFrame(1, block).serialize() for _ in range(20000)))
    end = c.goaway()
    assert end.error_code in (CALM, h2.errors.ErrorCodes.PROTOCOL_ERROR), end
    c.ends_closed()
    served_on(tern)


def test_hpack_table_past_the_size_allowed_is_a_compression_error(h2_tern):
    # tern's decoder table is the default 4096 bytes; a header block that
    # grows it to 1 MiB is refused with the whole connection.
    tern = h2_tern("--http2", "h2c")
    c = Raw(tern.port)
    c.enc.header_table_size = 1 << 20
    c.get(1, "/ping")
    end = c.goaway()
    assert end.error_code == h2.errors.ErrorCodes.COMPRESSION_ERROR, end
    c.ends_closed()


def test_a_window_held_at_zero_is_cut_by_the_send_timeout(h2_tern):
    # Slowloris over h2: the client's initial window is 0 and it never
    # opens it, so a response can never go. The send timeout ends it.
    tern = h2_tern("--http2", "h2c", "--send-timeout", "500", "--idle-timeout", "600000")
    c = Raw(tern.port, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 0})
    c.get(1, "/stream?chunks=10&size=10000")
    c.read_until(lambda: c.seen(hf.HeadersFrame, 1), "the response's head")
    t0 = time.monotonic()
    c.read_until(lambda: c.closed, "the cut")
    assert time.monotonic() - t0 < 10 * SLOW
    assert not c.seen(hf.DataFrame, 1) or all(not f.data for f in c.seen(hf.DataFrame, 1))
    c.sock.close()
    served_on(tern)


def test_an_idle_connection_ends_with_a_goaway(h2_tern):
    tern = h2_tern("--http2", "h2c", "--idle-timeout", "300")
    c = Raw(tern.port)
    c.get(1, "/ping")
    end = c.goaway()
    assert (end.error_code, end.last_stream_id) == (h2.errors.ErrorCodes.NO_ERROR, 1), end
    assert c.seen(hf.DataFrame, 1)
    c.ends_closed()
