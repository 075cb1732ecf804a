"""`tern load`, the WebSocket load generator: short runs of both modes
against a real `tern serve`, the errors that must end a run (exit 1 with a
clear message), bad options (exit 2), and, against small fake servers, the
client's side of the protocol: fragmented echoes, pings, wrong echoes."""
import base64
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import SANITIZED, SLOW, TERN_BIN, read_response

TIMEOUT = 30


def load(*args):
    """Runs `tern load ARGS` and returns (exit status, stdout, stderr). The
    load generator must never leave a sanitizer report, leaks included."""
    env = dict(os.environ)
    if SANITIZED:
        env["ASAN_OPTIONS"] = "detect_leaks=1:" + env.get("ASAN_OPTIONS", "")
    p = subprocess.run([TERN_BIN, "load", *args], capture_output=True, timeout=TIMEOUT, env=env)
    out, err = p.stdout.decode(), p.stderr.decode(errors="replace")
    for report in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        assert report not in err, err
    return p.returncode, out, err


def url(server, path="/ws"):
    return f"ws://{server.host}:{server.port}{path}"


def ws_connections_seen(tern):
    """How many WebSocket connections the server has accepted, this one
    included: `tern serve` numbers them in X-Tern-Connection."""
    s = tern.connect()
    key = base64.b64encode(os.urandom(16))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    st, h, _, _ = read_response(s)
    s.close()
    assert st == 101
    return int(h["x-tern-connection"])


def free_port():
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- against tern serve -------------------------------------------------------

def test_echo_measures_and_checks_every_echo(tern):
    code, out, err = load("echo", "--url", url(tern), "--connections", "4", "--size", "64",
                          "--duration", "1", "--warmup", "0.2", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "echo" and r["connections"] == 4 and r["size"] == 64
    assert r["messages"] > 0 and r["msg_per_s"] > 0
    assert 0.9 < r["duration_s"] < 1.5
    assert r["mb_per_s"] == pytest.approx(r["msg_per_s"] * 64 / 1e6, rel=0.01)
    lat = r["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert 0 < lat["mean"] <= lat["max"]
    assert r["unclean_closes"] == 0, err
    assert err == ""
    # The four connections were the server's, and it is still serving.
    assert ws_connections_seen(tern) == 5


def test_echo_over_wss_and_a_unix_socket(tern_factory, tmp_path):
    """wss:// (the client's TLS, checked against --ca-file or not at all
    with --insecure) and ws+unix: are the URLs tern_ws_connect takes."""
    from test_tls import make_cert
    cert, key = make_cert(str(tmp_path), "c", "localhost", "DNS:localhost,IP:127.0.0.1")
    sock = str(tmp_path / "tern.sock")
    srv = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                       "--unix", sock)
    for u, extra in ((f"wss://localhost:{srv.tls_port}/ws", ["--ca-file", cert]),
                     (f"wss://127.0.0.1:{srv.tls_port}/ws", ["--insecure"]),
                     (f"ws+unix:{sock}:/ws", [])):
        code, out, err = load("echo", "--url", u, *extra, "--connections", "2",
                              "--duration", "0.5", "--warmup", "0", "--json")
        assert code == 0, (u, err)
        r = json.loads(out)
        assert r["url"] == u and r["messages"] > 0, r
        assert r["unclean_closes"] == 0, err
    # Without the CA, the system's do not know the certificate.
    code, out, err = load("echo", "--url", f"wss://localhost:{srv.tls_port}/ws",
                          "--duration", "0.5", "--warmup", "0")
    assert code == 1 and "certificate" in err, err


def test_echo_text_output(tern):
    code, out, err = load("echo", "--url", url(tern), "--connections", "2", "--size", "1000",
                          "--duration", "0.5", "--warmup", "0")
    assert code == 0, err
    assert "2 connections, 1000-byte messages" in out
    assert "msg/s" in out and "MB/s" in out and "p99" in out


def test_echo_large_messages_and_empty_ones(tern):
    # Larger than a socket buffer: written in pieces, echoed in many reads.
    code, out, err = load("echo", "--url", url(tern), "--connections", "2", "--size", "3000000",
                          "--duration", "0.5", "--warmup", "0", "--json")
    assert code == 0, err
    assert json.loads(out)["messages"] > 0
    code, out, err = load("echo", "--url", url(tern), "--connections", "2", "--size", "0",
                          "--duration", "0.3", "--warmup", "0", "--json")
    assert code == 0, err
    assert json.loads(out)["messages"] > 0


def test_pipeline_counts_every_echo(tern):
    # 2005 is not a multiple of the depth: the last batch is shorter.
    code, out, err = load("pipeline", "--url", url(tern), "--connections", "2", "--depth", "8",
                          "--size", "16", "--iterations", "2005", "--warmup-iterations", "200",
                          "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "pipeline" and r["depth"] == 8
    assert r["messages"] == 2 * 2005
    assert r["echo_bytes"] == 2 * 2005 * (2 + 16)   # the server's 2-byte header + payload
    assert r["msg_per_s"] > 0 and r["seconds"] > 0
    assert r["unclean_closes"] == 0, err
    assert ws_connections_seen(tern) == 3


def test_pipeline_large_batches(tern):
    # A batch of 16 x 60 kB is more than the socket buffers hold: the
    # server echoes the first frames while the client still writes.
    code, out, err = load("pipeline", "--url", url(tern), "--connections", "2", "--depth", "16",
                          "--size", "60000", "--iterations", "64", "--warmup-iterations", "0",
                          "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["messages"] == 128 and r["echo_bytes"] == 128 * (4 + 60000)


def test_nothing_listening_is_an_error():
    port = free_port()
    code, out, err = load("echo", "--url", f"ws://127.0.0.1:{port}/ws", "--duration", "1")
    assert code == 1
    assert f"connect to 127.0.0.1:{port}: Connection refused" in err
    assert out == ""


def test_http_route_is_not_a_websocket(tern):
    for mode in ("echo", "pipeline"):
        code, out, err = load(mode, "--url", url(tern, "/ping"), "--connections", "2")
        assert code == 1
        assert "answered 200 OK, not 101" in err and "(is /ping a WebSocket route?)" in err, err
        assert out == ""


def test_server_going_away_during_the_run_is_an_error(tern_factory):
    srv = tern_factory()
    p = subprocess.Popen([TERN_BIN, "load", "echo", "--url", url(srv), "--connections", "3",
                          "--duration", "20", "--warmup", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Once the connections are open and busy, a graceful shutdown.
        time.sleep(0.5 * SLOW)
        assert p.poll() is None
        code = srv.stop()
        assert code == 0
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        p.kill()
    assert p.returncode == 1
    assert b"closed the connection during the run: 1012" in err, err


def test_fanout_rounds_against_tern_serve(tern):
    # 20 connections, a round every 0.25 s each: about 120 rounds in 1.5 s.
    code, out, err = load("fanout", "--url", url(tern, "/fanout"), "--connections", "20",
                          "--interval", "0.25", "--duration", "1.5", "--warmup", "0.5", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "fanout" and r["replies"] == 10 and r["reply_size"] == 10000
    assert 100 <= r["rounds_sent"] <= 125, r
    assert r["missed"] == 0 and r["rounds"] == r["rounds_sent"], r
    assert r["messages"] == 10 * r["rounds"]
    assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"] < 250000
    assert r["unclean_closes"] == 0, err


def test_fanout_counts_rounds_the_server_does_not_answer():
    """A server that answers every other request: the rounds it leaves
    unanswered are skipped (the last is still in flight), and counted."""

    def serve(s, frames):
        n = 0
        while True:
            fin, op, payload = frames.read()
            if op == 0x8:
                s.sendall(server_frame(0x8, payload))
                return
            n += 1
            if n % 2 == 1:
                s.sendall(server_frame(0x2, b"r" * 1000) * 3)

    fake = FakeServer(serve)
    try:
        code, out, err = load("fanout", "--url", fake_url(fake), "--connections", "4",
                              "--replies", "3", "--reply-size", "1000", "--interval", "0.1",
                              "--duration", "1", "--warmup", "0", "--json")
    finally:
        fake.close()
    assert code == 0, err
    r = json.loads(out)
    # each connection: a round answered, one asked and never answered, then
    # skipped ever after
    assert r["rounds"] == 4, r
    assert r["missed"] >= 4 * 8, r


def test_pubsub_against_tern_serve_loses_nothing(tern):
    code, out, err = load("pubsub", "--url", url(tern, "/fanout/sub"), "--publish-path",
                          "/fanout/pub", "--connections", "10", "--rate", "200",
                          "--duration", "1", "--warmup", "0.3", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "pubsub" and r["connections"] == 10 and r["size"] == 256
    assert 180 <= r["published"] <= 215, r
    assert r["gaps"] == 0 and r["shed"] == 0, r
    # what was published in the window reached every subscriber (the edges
    # of the window may shift a message either way)
    assert abs(r["messages"] - r["expected"]) <= 10 * 5, r
    assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"] < 500000
    assert r["unclean_closes"] == 0, err


@pytest.mark.parametrize("history", [True, False])
def test_pubsub_cut_and_resume(tern_factory, history):
    """Every subscriber cut mid-run and back 0.5 s later: with a history
    each resumes after its last message and misses nothing (a duplicate
    would fail the run); without one, each is told so and the gap shows."""
    t = tern_factory("--feed", "off", *(["--pubsub-history", "100"] if history else []))
    code, out, err = load("pubsub", "--url", url(t, "/fanout/sub"), "--publish-path",
                          "/fanout/pub", "--connections", "20", "--rate", "50",
                          "--duration", "2.5", "--warmup", "0.3", "--cut-at", "0.8",
                          "--cut-for", "0.5", "--json")
    assert code == 0, err
    r = json.loads(out)
    cut = r["cut"]
    assert cut["unanswered"] == 0 and abs(cut["reconnect_s"] - 1.3) < 0.3, r
    if history:
        assert cut["resumed"] == 20 and cut["not_resumed"] == 0, r
        assert cut["replayed"] >= 20 * 20, r   # 0.5 s at 50/s each
        assert r["gaps"] == 0, r
        assert abs(r["messages"] - r["expected"]) <= 20 * 5, r
    else:
        assert cut["resumed"] == 0 and cut["not_resumed"] == 20, r
        assert r["gaps"] >= 20 * 20, r


def test_pubsub_counts_what_a_subscriber_missed():
    """A fake broker that forwards every message to two subscribers but
    keeps every tenth from the first: the gaps in its sequence are counted;
    a message out of order ends the run."""
    subs, locks, lock = [], [], threading.Lock()

    def serve(s, frames):
        with lock:
            me = len(subs) if frames.path != "/pub" else 2
            if me < 2:
                subs.append(s)
                locks.append(threading.Lock())
        while True:
            fin, op, payload = frames.read()
            if op == 0x8:
                with (locks[me] if me < 2 else lock):
                    s.sendall(server_frame(0x8, payload))
                return
            seq = struct.unpack("<Q", payload[8:16])[0]
            for i, sub in enumerate(subs):
                if i == 0 and seq % 10 == 3:
                    continue
                with locks[i]:
                    sub.sendall(server_frame(0x2, payload))

    fake = FakeServer(serve)
    try:
        code, out, err = load("pubsub", "--url", fake_url(fake), "--publish-path", "/pub",
                              "--connections", "2", "--rate", "100", "--size", "64",
                              "--duration", "1", "--warmup", "0", "--json")
    finally:
        fake.close()
    assert code == 0, err
    r = json.loads(out)
    assert 8 <= r["gaps"] <= 11, r
    assert abs(r["messages"] - (r["expected"] - r["gaps"])) <= 4, r


def test_market_conflation_keeps_slow_readers_at_the_latest(tern_factory):
    """Keyed updates, half the readers slow: a conflating topic holds at
    most one queued update per key for each of them, disconnects no one,
    and once they catch up every reader holds every key's latest update;
    the fast ones miss nothing."""
    t = tern_factory("--feed", "off", "--sndbuf", "65536",
                     "--pubsub-topic-policy", "fanout=conflate")
    code, out, err = load("market", "--url", url(t, "/fanout/sub"), "--publish-path",
                          "/fanout/pub-keyed", "--connections", "20", "--slow-fraction", "0.5",
                          "--slow-rate", "4096", "--rate", "200", "--instruments", "10",
                          "--duration", "4", "--warmup", "0.5", "--drain", "2", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "market" and r["slow"] == 10 and r["instruments"] == 10
    assert r["disconnects"] == 0 and r["stale_keys"] == 0 and r["stale_keys_fast"] == 0, r
    assert r["gaps"] == 0 and r["key_reorders"] == 0, r
    assert 700 <= r["published"] <= 850, r
    # the slow ones got about their byte rate's worth: 4096 B/s of 520-byte frames
    assert 0 < r["slow_msg_per_s"] / 10 < 4096 / 520 * 1.5, r
    ps = t.stats()["total"]["pubsub"]
    assert ps["conflated"] > 0 and 0 < ps["queue_max"] <= 10, ps


def test_keyed_publisher_needs_its_key_prefix(tern):
    from websockets.sync.client import connect
    from websockets.exceptions import ConnectionClosed
    with connect(url(tern, "/fanout/pub-keyed")) as ws:
        ws.send(b"\x00abc")
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=5)
        assert e.value.rcvd.code == 1007


@pytest.mark.parametrize("args, message", [
    ([], "--url is required"),
    (["--url", "http://x/"], "must start with ws://"),
    (["--url", "redis://x/"], "not a WebSocket URL"),
    (["--url", "wss://x:0/"], "bad port"),
    (["--url", "ws://x:0/"], "bad port"),
    (["--url", "ws://x/p#frag"], "a fragment"),
    (["--url", "ws://u@x/"], "user info"),
    (["--url", "ws://x/", "--connections", "0"], "bad value for --connections"),
    (["--url", "ws://x/", "--duration", "soon"], "bad value for --duration"),
    (["--url", "ws://x/", "--depth", "4"], "--depth is an option of tern load pipeline"),
    (["--url", "ws://x/", "--rate", "4"], "--rate is an option of tern load pubsub and market"),
    (["--url", "ws://x/", "--drain", "4"], "--drain is an option of tern load market"),
    (["--url", "ws://x/", "--cut-at", "1"], "--cut-at is an option of tern load pubsub"),
    (["--url", "ws://x/", "stray"], "unexpected argument 'stray'"),
])
def test_bad_options_exit_2(args, message):
    code, out, err = load("echo", *args)
    assert code == 2
    assert message in err, err


def test_usage():
    code, out, err = load("--help")
    assert code == 0 and "tern load echo" in out and "tern load pipeline" in out
    code, out, err = load("nonsense")
    assert code == 2 and "unknown mode 'nonsense'" in err
    code, out, err = load("pipeline", "--url", "ws://x/", "--warmup", "1")
    assert code == 2 and "--warmup is an option of tern load echo, fanout, pubsub and market" in err
    code, out, err = load("pubsub", "--url", "ws://x/")
    assert code == 2 and "--publish-path is required" in err
    code, out, err = load("pubsub", "--url", "ws://x/", "--publish-path", "/p", "--cut-at", "1")
    assert code == 2 and "--cut-at and --cut-for go together" in err
    code, out, err = load("pubsub", "--url", "ws://x/", "--publish-path", "/p", "--cut-at", "9",
                          "--cut-for", "1", "--duration", "10")
    assert code == 2 and "the cut ends before --duration" in err
    code, out, err = load("pubsub", "--url", "ws://x/", "--publish-path", "/p", "--size", "15")
    assert code == 2 and "--size is at least 16" in err
    code, out, err = load("market", "--url", "ws://x/", "--publish-path", "/p", "--size", "20")
    assert code == 2 and "--size is at least 21 (the stamp and the key)" in err
    code, out, err = load("market", "--url", "ws://x/", "--publish-path", "/p",
                          "--slow-fraction", "1.5")
    assert code == 2 and "bad value for --slow-fraction" in err


# ---- against fake servers: the client's side of the protocol --------------------

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class FakeServer:
    """Accepts WebSocket connections on 127.0.0.1 and hands each, after the
    handshake, to serve(sock, reader) on a thread of its own."""

    def __init__(self, serve):
        self.serve = serve
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.host, self.port = "127.0.0.1", self.lsock.getsockname()[1]
        self.errors = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(s,), daemon=True).start()

    def _conn(self, s):
        try:
            s.settimeout(10)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += s.recv(4096)
            head, _, rest = buf.partition(b"\r\n\r\n")
            key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
                   if l.lower().startswith(b"sec-websocket-key:")][0]
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            frames = ClientFrames(s, rest)
            frames.path = head.split(b" ")[1].decode()
            self.serve(s, frames)
        except (OSError, EOFError) as e:
            self.errors.append(e)
        finally:
            s.close()

    def close(self):
        self.lsock.close()


class ClientFrames:
    """Reads the masked frames a client sends."""

    def __init__(self, s, pending=b""):
        self.s, self.buf = s, pending

    def _need(self, n):
        while len(self.buf) < n:
            b = self.s.recv(65536)
            if not b:
                raise EOFError("client closed")
            self.buf += b

    def read(self):
        self._need(2)
        b0, b1 = self.buf[0], self.buf[1]
        assert b1 & 0x80, "client frames must be masked"
        n, off = b1 & 0x7F, 2
        if n == 126:
            self._need(4)
            n, off = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10)
            n, off = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(off + 4 + n)
        key = self.buf[off:off + 4]
        payload = bytes(c ^ key[i % 4] for i, c in enumerate(self.buf[off + 4:off + 4 + n]))
        self.buf = self.buf[off + 4 + n:]
        return b0 & 0x80 != 0, b0 & 0x0F, payload


def server_frame(opcode, payload=b"", fin=True):
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", b0, n) + payload
    return struct.pack("!BBH", b0, 126, n) + payload


def fake_url(fake):
    return f"ws://{fake.host}:{fake.port}/ws"


def test_fragmented_echoes_and_pings_are_understood():
    """Echoes split in three fragments with pings in between: the client
    puts the message together, checks it, and answers every ping."""
    pongs = []

    def serve(s, frames):
        while True:
            fin, op, payload = frames.read()
            if op == 0x8:   # the client's close: answer it, close TCP first
                assert payload == struct.pack("!H", 1000)
                s.sendall(server_frame(0x8, payload))
                return
            if op == 0xA:
                pongs.append(payload)
                continue
            assert fin and op == 0x2
            a, b = len(payload) // 3, 2 * len(payload) // 3
            s.sendall(server_frame(0x2, payload[:a], fin=False) + server_frame(0x9, b"hb") +
                      server_frame(0x0, payload[a:b], fin=False))
            s.sendall(server_frame(0x9, b"") + server_frame(0x0, payload[b:]))

    fake = FakeServer(serve)
    try:
        code, out, err = load("echo", "--url", fake_url(fake), "--connections", "2",
                              "--size", "300", "--duration", "0.5", "--warmup", "0", "--json")
    finally:
        fake.close()
    assert code == 0, err
    r = json.loads(out)
    assert r["messages"] > 0 and r["unclean_closes"] == 0
    assert b"hb" in pongs and b"" in pongs


def test_wrong_echo_is_an_error():
    def serve(s, frames):
        fin, op, payload = frames.read()
        bad = bytearray(payload)
        bad[40] ^= 1
        s.sendall(server_frame(0x2, bytes(bad)))
        frames.read()

    fake = FakeServer(serve)
    try:
        code, out, err = load("echo", "--url", fake_url(fake), "--connections", "1",
                              "--size", "64", "--duration", "1", "--warmup", "0")
    finally:
        fake.close()
    assert code == 1
    assert "wrong echo: message 1 differs from what was sent at byte 40" in err, err


def test_short_echo_and_bad_accept_are_errors():
    def short(s, frames):
        fin, op, payload = frames.read()
        s.sendall(server_frame(0x2, payload[:-1]))
        frames.read()

    fake = FakeServer(short)
    try:
        code, out, err = load("echo", "--url", fake_url(fake), "--connections", "1",
                              "--duration", "1", "--warmup", "0")
    finally:
        fake.close()
    assert code == 1 and "wrong echo: 63 bytes for the 64 sent" in err, err

    # A server that answers 101 with someone else's Sec-WebSocket-Accept.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def bad_accept():
        s, _ = lsock.accept()
        s.recv(4096)
        s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
        s.recv(4096)
        s.close()

    t = threading.Thread(target=bad_accept, daemon=True)
    t.start()
    try:
        code, out, err = load("echo", "--url", f"ws://127.0.0.1:{lsock.getsockname()[1]}/",
                              "--connections", "1", "--duration", "1")
    finally:
        lsock.close()
    assert code == 1 and "wrong Sec-WebSocket-Accept" in err, err


def test_the_cut_resets_subscribers_and_the_resumed_ones_close_cleanly():
    """pubsub's cut drops every subscriber's connection with a reset, no
    close frame (what a failed network or a killed client shows a server);
    each connects again asking to resume after its last message, and at
    the end closes with a close frame. A fake broker records how each
    connection ended."""
    lock = threading.Lock()
    subs = {}    # socket -> its lock, for the publisher's thread to write to
    ends = []    # (path, how the connection ended)
    # Only the first messages are forwarded, long before the cut: a send
    # from the publisher's thread racing the reset would take the error
    # (ECONNRESET is reported once) and leave the reader an EOF.
    forward_until = 20

    def serve(s, frames):
        path = frames.path
        if path != "/pub":
            m = re.search(r"after=(\d+)", path)
            ack = ('{"epoch":"abc","seq":%s,"resumed":true,"replayed":0}' % m.group(1) if m
                   else '{"epoch":"abc","seq":0}')
            s.sendall(server_frame(0x1, ack.encode()))
            with lock:
                subs[s] = threading.Lock()
        how = "eof"
        try:
            while True:
                fin, op, payload = frames.read()
                if op == 0x8:
                    how = "close"
                    with lock:
                        sl = subs.pop(s, None)
                    with sl or lock:
                        s.sendall(server_frame(0x8, payload))
                    return
                if path == "/pub" and struct.unpack("<Q", payload[8:16])[0] <= forward_until:
                    with lock:
                        targets = list(subs.items())
                    for sub, sl in targets:
                        try:
                            with sl:
                                sub.sendall(server_frame(0x2, payload))
                        except OSError:
                            pass
        except ConnectionResetError:
            how = "reset"
        except EOFError:
            how = "eof"
        finally:
            with lock:
                subs.pop(s, None)
                ends.append((path.split("?")[0] + ("?resume" if "after=" in path else ""), how))

    fake = FakeServer(serve)
    try:
        code, out, err = load("pubsub", "--url", fake_url(fake), "--publish-path", "/pub",
                              "--connections", "3", "--rate", "100", "--size", "64",
                              "--duration", "2", "--warmup", "0", "--cut-at", "0.5",
                              "--cut-for", "0.5", "--json")
        deadline = time.time() + 5
        while len(ends) < 7 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        fake.close()
    assert code == 0, err
    r = json.loads(out)
    assert r["cut"]["resumed"] == 3 and r["cut"]["unanswered"] == 0, r
    assert sorted(ends) == sorted([("/pub", "close")] + [("/ws", "reset")] * 3 +
                                  [("/ws?resume", "close")] * 3), ends


def test_a_host_name_with_several_addresses(tern):
    """localhost may resolve to ::1 before 127.0.0.1, where tern serve
    listens: the next address is tried, as the client API does."""
    code, out, err = load("echo", "--url", "ws://localhost:%d/ws" % tern.port,
                          "--connections", "3", "--duration", "0.3", "--warmup", "0", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["messages"] > 0 and r["unclean_closes"] == 0, r
