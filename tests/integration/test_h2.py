"""HTTP/2: `tern serve` offers h2 by ALPN on its TLS port (unless --http2
off) and h2c with prior knowledge on its plain port only with --http2 h2c.
Driven by curl (--http2, --http2-prior-knowledge), by Go's net/http client
(tests/clients/go/h2client) and, where neither can say what a test needs
(a stream reset while its answer is pending, many streams on one
connection), by Python's h2 package over a socket."""
import json
import os
import socket
import ssl
import subprocess
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hyperframe.frame
import pytest

from conftest import SANITIZED, SLOW, go_build, wait_for
from test_tls import make_cert


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("h2certs"))
    return make_cert(d, "h2", "localhost", "DNS:localhost,IP:127.0.0.1")


@pytest.fixture
def h2_tern(tern_factory, cert):
    def start(*args):
        return tern_factory("--tls-port", "0", "--tls-cert", cert[0], "--tls-key", cert[1], *args)
    return start


def curl(*args, data=None):
    """curl's output and '%{http_version} %{http_code}' as (body, version, code)."""
    out = subprocess.run(["curl", "-sk", "--max-time", str(int(10 * SLOW)), *args,
                          "-w", "\n@@%{http_version} %{http_code}"],
                         input=data, capture_output=True, check=False).stdout
    body, _, tail = out.rpartition(b"\n@@")
    version, code = tail.decode().split()
    return body, version, code


# ---- negotiation -------------------------------------------------------------

def alpn_of(tern, offer):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(offer)
    raw = socket.create_connection((tern.host, tern.tls_port), timeout=5 * SLOW)
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        return s.selected_alpn_protocol()


def test_tls_port_offers_h2_then_http11_by_default(h2_tern):
    tern = h2_tern()
    assert alpn_of(tern, ["h2", "http/1.1"]) == "h2"
    assert alpn_of(tern, ["http/1.1"]) == "http/1.1"
    body, version, code = curl("--http2", f"https://127.0.0.1:{tern.tls_port}/ping")
    assert (body, version, code) == (b"pong", "2", "200")
    # HTTP/1.1 on the same port still works, a WebSocket upgrade included.
    assert curl("--http1.1", f"https://127.0.0.1:{tern.tls_port}/ping")[1:] == ("1.1", "200")


def test_http2_off_offers_http11_alone(h2_tern):
    tern = h2_tern("--http2", "off")
    assert alpn_of(tern, ["h2", "http/1.1"]) == "http/1.1"
    assert curl("--http2", f"https://127.0.0.1:{tern.tls_port}/ping") == (b"pong", "1.1", "200")


def test_h2c_only_when_asked(h2_tern):
    tern = h2_tern()
    # Prior knowledge on a plain port that does not serve it: its preface
    # is no HTTP/1.1 request, and nothing answers it in HTTP/2.
    body, version, code = curl("--http2-prior-knowledge", f"{tern.base}/ping")
    assert version != "2"
    tern2 = h2_tern("--http2", "h2c")
    assert curl("--http2-prior-knowledge", f"{tern2.base}/ping") == (b"pong", "2", "200")
    # HTTP/1.1 on that port is unchanged, and Upgrade: h2c is not answered.
    assert curl("--http2", f"{tern2.base}/ping") == (b"pong", "1.1", "200")
    # The admin listener stays HTTP/1.1: h2c was asked for the public port.
    assert curl("--http2-prior-knowledge", f"{tern2.admin_base}/healthz")[1] != "2"
    assert curl(f"{tern2.admin_base}/healthz")[1:] == ("1.1", "200")


# ---- what a handler does, over h2 --------------------------------------------

def test_bodies_streams_files_and_later_answers(h2_tern, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    big = os.urandom(3 << 20)
    (root / "big.bin").write_bytes(big)
    tern = h2_tern("--root", str(root))
    base = f"https://127.0.0.1:{tern.tls_port}"
    # a buffered body, echoed
    assert curl("--http2", "-d", "hello body", f"{base}/echo") == (b"hello body", "2", "200")
    # a streamed body of 3 MiB, bigger than every window: read as it comes
    up = os.urandom(3 << 20)
    assert curl("--http2", "--data-binary", "@-", f"{base}/upload", data=up) == \
        (upload_sum(up), "2", "200")
    # a streamed response
    body, version, code = curl("--http2", f"{base}/stream?chunks=300&size=10000")
    assert (len(body), version, code) == (3000000, "2", "200")
    assert body[:10000] == b"a" * 10000 and body[-1:] == b"n"
    # a file
    assert curl("--http2", f"{base}/big.bin") == (big, "2", "200")
    # an answer from a timer
    assert curl("--http2", f"{base}/delay?ms=100") == (b"done\n", "2", "200")
    # the server's own answers, and HEAD
    assert curl("--http2", f"{base}/nope")[2] == "404"
    head = subprocess.run(["curl", "-sk", "--http2", "-I", f"{base}/ping"], capture_output=True,
                          check=True).stdout.decode().lower()
    assert head.startswith("http/2 200") and "content-length: 4" in head
    assert "\nserver: tern\r\n" in head and "\ndate: " in head, head


def test_many_streams_on_one_connection(h2_tern):
    tern = h2_tern()
    base = f"https://127.0.0.1:{tern.tls_port}"
    urls = [f"{base}/delay?ms=200"] * 20 + [f"{base}/ping"] * 20
    out = subprocess.run(["curl", "-sk", "--http2", "-Z", "--parallel-max", "50",
                          "-w", "%{http_version} %{http_code} %{num_connects}\n",
                          *[x for u in urls for x in (u, "-o", "/dev/null")]],
                         capture_output=True, check=True).stdout.decode().split("\n")
    lines = [x for x in out if x]
    assert len(lines) == 40
    assert all(x.startswith("2 200") for x in lines), lines
    # curl multiplexed them over one connection
    assert sum(int(x.split()[2]) for x in lines) == 1


def upload_sum(data):
    """What /upload answers for data: its length and checksum."""
    s = 0
    for b in data:
        s = (s * 31 + b) & 0xFFFFFFFF
    return f"{len(data)} {s}\n".encode()


def test_expect_100_continue_is_answered_so_the_body_comes(h2_tern):
    # A client that sends "Expect: 100-continue" holds its body until the
    # server's 100 or its own timeout (curl: a second; 60 s here, past
    # --max-time, so a server that owes the 100 fails the test). A
    # buffered body's 100 goes at once; a streamed one's when its handler
    # reads (/upload).
    tern = h2_tern()
    base = f"https://127.0.0.1:{tern.tls_port}"
    body = os.urandom(200000)
    for path, want in (("/echo", body), ("/upload", upload_sum(body))):
        p = subprocess.run(["curl", "-sk", "-v", "--http2", "--max-time", str(int(10 * SLOW)),
                            "--expect100-timeout", "60", "-H", "Expect: 100-continue",
                            "--data-binary", "@-", "-w", "\n@@%{http_version} %{http_code}",
                            f"{base}{path}"], input=body, capture_output=True, check=False)
        got, _, tail = p.stdout.rpartition(b"\n@@")
        assert p.returncode == 0, (path, p.returncode, p.stderr[-500:])
        assert (got, tail) == (want, b"2 200"), (path, tail)
        assert b"< HTTP/2 100" in p.stderr, (path, p.stderr[-500:])


@pytest.fixture(scope="session")
def go_h2client(tmp_path_factory):
    return go_build(tmp_path_factory, "./h2client", "h2client")


def test_go_net_http_client_speaks_h2(h2_tern, go_h2client):
    tern = h2_tern()
    p = subprocess.run([go_h2client, f"https://127.0.0.1:{tern.tls_port}"],
                       capture_output=True, text=True, timeout=60 * SLOW)
    out = json.loads(p.stdout)
    assert p.returncode == 0 and "error" not in out, (out, p.stderr[-500:])
    assert out["client"].startswith("go net/http go1.")
    h2 = {"proto": "HTTP/2.0", "status": 200, "same": True}
    assert out["ping"] == {**h2, "len": 4}
    # 1 MiB, more than a window: read as it comes, and again after a 100
    assert out["echo"] == {**h2, "len": 1 << 20}
    assert out["expect"] == {**h2, "len": 1 << 20}
    assert out["stream"] == {**h2, "len": 1000000, "same": True}
    assert out["parallel"] == [{**h2, "len": 5}] * 50
    assert out["dials"] == 1   # everything over one connection


def test_streams_awaiting_slow_handlers_keep_the_connection_past_its_idle_timeout(h2_tern):
    # The idle timeout is for a connection with no stream; one whose
    # streams all wait on their handlers has no clock (RFC 9113 gives a
    # server none to apply), so the answers come, and then the idle
    # timeout ends it.
    tern = h2_tern("--http2", "h2c", "--idle-timeout", "300")
    c = H2(tern.port)
    sids = [c.get("/delay?ms=1500") for _ in range(3)]
    c.read(lambda: all(c.of(h2.events.StreamEnded, sid) for sid in sids), "the slow answers")
    assert all(b"".join(e.data for e in c.of(h2.events.DataReceived, sid)) == b"done\n"
               for sid in sids)
    assert not c.of(h2.events.ConnectionTerminated)
    c.read(lambda: c.of(h2.events.ConnectionTerminated), "the idle timeout's GOAWAY")
    c.sock.close()


# ---- Python's h2: resets, limits, drain ---------------------------------------

_h2_ctx = None


def h2_client_ctx():
    """One TLS client context offering h2 alone, unverified, made once:
    making one loads the system's CA store, tens of milliseconds."""
    global _h2_ctx
    if _h2_ctx is None:
        _h2_ctx = ssl.create_default_context()
        _h2_ctx.check_hostname = False
        _h2_ctx.verify_mode = ssl.CERT_NONE
        _h2_ctx.set_alpn_protocols(["h2"])
    return _h2_ctx


class H2:
    """A client connection with prior knowledge (plain port), or with tls
    over TLS, h2 chosen by ALPN (the TLS port)."""

    def __init__(self, port, tls=False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5 * SLOW)
        # each frame is its own write: without this, Nagle holds a request
        # behind the unacknowledged preface (a delayed ACK, 40 ms)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scheme = "https" if tls else "http"
        if tls:
            self.sock = h2_client_ctx().wrap_socket(self.sock, server_hostname="localhost")
            assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.events = []

    def flush(self):
        self.sock.sendall(self.conn.data_to_send())

    def get(self, path):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "GET"), (":path", path),
                                     (":scheme", self.scheme), (":authority", "localhost")],
                               end_stream=True)
        self.flush()
        return sid

    def read(self, until, what):
        deadline = time.monotonic() + 10 * SLOW
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.events}"
            data = self.sock.recv(65536)
            if not data:
                self.events.append("closed")
                assert until(), f"closed before {what}: {self.events}"
                return
            for ev in self.conn.receive_data(data):
                self.events.append(ev)
                if isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            self.flush()

    def of(self, kind, sid=None):
        return [e for e in self.events if isinstance(e, kind) and
                (sid is None or getattr(e, "stream_id", None) == sid)]


def test_reset_stream_aborts_its_request_and_not_the_connection(h2_tern):
    # Resets leave the connection serving (that each fires its request's
    # abort callback is test_h2.c's, in the unit tests).
    tern = h2_tern("--http2", "h2c")
    c = H2(tern.port)
    sids = [c.get("/delay?ms=60000") for _ in range(10)]
    c.read(lambda: c.of(h2.events.SettingsAcknowledged), "the settings' ack")
    for sid in sids:
        c.conn.reset_stream(sid)
    c.flush()
    # The connection serves on.
    sid = c.get("/ping")
    c.read(lambda: c.of(h2.events.StreamEnded, sid), "/ping's answer")
    assert b"".join(e.data for e in c.of(h2.events.DataReceived, sid)) == b"pong"
    assert not c.of(h2.events.ResponseReceived, sids[0])
    c.sock.close()


def test_concurrent_streams_limit_is_100_and_enforced(h2_tern):
    tern = h2_tern("--http2", "h2c")
    c = H2(tern.port)
    c.read(lambda: c.of(h2.events.SettingsAcknowledged), "the settings' ack")
    settings = c.of(h2.events.RemoteSettingsChanged)[0].changed_settings
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 100
    # The client's h2 keeps to the limit itself: lift it to send the 101st.
    c.conn.remote_settings.update({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
    c.conn.remote_settings.acknowledge()
    sids = [c.get("/delay?ms=60000") for _ in range(101)]
    # Past a limit the client has acknowledged, nghttp2 ends the connection
    # (RFC 9113 §5.1.2 allows a PROTOCOL_ERROR), naming the last stream
    # it took: the 100th.
    c.read(lambda: c.of(h2.events.ConnectionTerminated), "the GOAWAY")
    end = c.of(h2.events.ConnectionTerminated)[0]
    assert end.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert end.last_stream_id == sids[99]
    c.sock.close()


def test_header_list_over_max_head_is_431(h2_tern):
    tern = h2_tern("--http2", "h2c", "--max-head", "4096")
    c = H2(tern.port)
    c.read(lambda: c.of(h2.events.SettingsAcknowledged), "the settings' ack")
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, [(":method", "GET"), (":path", "/ping"), (":scheme", "http"),
                              (":authority", "localhost"), ("x-big", "b" * 5000)],
                        end_stream=True)
    c.flush()
    c.read(lambda: c.of(h2.events.StreamEnded, sid) or c.of(h2.events.StreamReset, sid),
           "the answer")
    assert dict(c.of(h2.events.ResponseReceived, sid)[0].headers)[b":status"] == b"431"
    sid = c.get("/ping")
    c.read(lambda: c.of(h2.events.StreamEnded, sid), "/ping's answer")
    c.sock.close()


def test_drain_sends_goaway_and_finishes_the_streams_open(h2_tern):
    # Read frame by frame (hyperframe, under h2): h2's connection takes no
    # frame after a GOAWAY, and the test is that the answer still comes.
    tern = h2_tern("--http2", "h2c", "--shutdown-timeout", "20000")
    c = H2(tern.port)
    sid = c.get("/delay?ms=500")
    got, buf = [], b""

    def read_until(cond, what):
        nonlocal buf
        deadline = time.monotonic() + 10 * SLOW
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {got}"
            data = c.sock.recv(65536)
            assert data, f"closed before {what}: {got}"
            buf += data
            while len(buf) >= 9:
                f, n = hyperframe.frame.Frame.parse_frame_header(memoryview(buf[:9]))
                if len(buf) < 9 + n:
                    break
                f.parse_body(memoryview(buf[9:9 + n]))
                buf = buf[9 + n:]
                got.append(f)

    def seen(kind, flag=None):
        return [f for f in got if isinstance(f, kind) and (flag is None or flag in f.flags)]

    read_until(lambda: seen(hyperframe.frame.SettingsFrame, "ACK"), "the settings' ack")
    tern.proc.send_signal(2)   # SIGINT: the graceful shutdown
    read_until(lambda: seen(hyperframe.frame.GoAwayFrame), "the GOAWAY")
    goaway = seen(hyperframe.frame.GoAwayFrame)[0]
    assert (goaway.last_stream_id, goaway.error_code) == (sid, 0)
    read_until(lambda: seen(hyperframe.frame.DataFrame, "END_STREAM"), "the stream's answer")
    assert b"".join(f.data for f in seen(hyperframe.frame.DataFrame)) == b"done\n"
    wait_for(lambda: tern.proc.poll() is not None, "the server's exit")
    assert tern.proc.returncode == 0


def test_access_log_names_each_stream(h2_tern, tmp_path):
    log = str(tmp_path / "access.log")
    tern = h2_tern("--access-log", log)
    base = f"https://127.0.0.1:{tern.tls_port}"
    assert curl("--http2", f"{base}/ping")[1:] == ("2", "200")
    assert curl("--http2", f"{base}/nope")[1:] == ("2", "404")

    def lines():
        return open(log).read().splitlines() if os.path.exists(log) else []
    wait_for(lambda: len(lines()) >= 2, "two access log lines")
    assert " 127.0.0.1:" in lines()[0] and " GET /ping 200 4 " in lines()[0], lines()
    assert " GET /nope 404 " in lines()[1], lines()


def test_rapid_reset_ends_the_connection_and_the_server_serves_on(h2_tern):
    # CVE-2023-44487: streams opened and reset at once, faster than any
    # answer. nghttp2's reset budget (1000 at once, 33 a second more) ends
    # such a connection with a GOAWAY; every request it reached
    # was aborted (test_h2.c shows one), and others are served.
    tern = h2_tern("--http2", "h2c")
    c = H2(tern.port)
    c.read(lambda: c.of(h2.events.SettingsAcknowledged), "the settings' ack")
    try:
        for i in range(1500):
            sid = c.get("/delay?ms=60000")
            c.conn.reset_stream(sid)
            if i % 50 == 49:
                c.flush()
        c.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass   # ended already, while we were still sending
    c.read(lambda: "closed" in c.events or c.of(h2.events.ConnectionTerminated), "the end")
    ends = c.of(h2.events.ConnectionTerminated)
    # Debian's nghttp2 says INTERNAL_ERROR; the stream named is the
    # 1001st, within the burst's reach, not the 1500th.
    assert ends and ends[0].error_code in (h2.errors.ErrorCodes.INTERNAL_ERROR,
                                           h2.errors.ErrorCodes.ENHANCE_YOUR_CALM), ends
    assert ends[0].last_stream_id < 2 * 1500 - 1, ends
    c.sock.close()
    assert curl("--http2-prior-knowledge", f"{tern.base}/ping") == (b"pong", "2", "200")


def test_mixed_streams_at_once_and_a_client_that_leaves_mid_answer(h2_tern, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "f.bin").write_bytes(os.urandom(1 << 20))
    tern = h2_tern("--http2", "h2c", "--root", str(root))
    paths = ["/stream?chunks=100&size=10000", "/delay?ms=50", "/echo?size=100000", "/ping",
             "/f.bin"] * 30
    want = {"/stream?chunks=100&size=10000": 1000000, "/delay?ms=50": 5,
            "/echo?size=100000": 100000, "/ping": 4, "/f.bin": 1 << 20}
    # Over TLS: curl 7.88.1 fails a reused prior-knowledge connection on
    # its side (curl/curl#10634, fixed in 8.0).
    base = f"https://127.0.0.1:{tern.tls_port}"
    out = subprocess.run(["curl", "-sk", "--http2", "-Z", "--parallel-max", "100",
                          "-w", "%{http_version} %{http_code} %{size_download} %{url}\n",
                          *[x for p in paths for x in (f"{base}{p}", "-o", "/dev/null")]],
                         capture_output=True, check=True).stdout.decode().splitlines()
    assert len(out) == len(paths)
    for line in out:
        version, code, size, url = line.split(" ", 3)
        assert (version, code) == ("2", "200") and int(size) == want[url[len(base):]], line
    # A client that leaves with 50 answers under way: every stream ends
    # with the connection (clean under the sanitizers), the server serves on.
    c = H2(tern.port)
    sids = [c.get("/stream?chunks=1000&size=10000") for _ in range(50)]
    c.read(lambda: len(c.of(h2.events.DataReceived)) >= 10, "some of the answers")
    c.sock.close()
    assert curl("--http2-prior-knowledge", f"{tern.base}/ping") == (b"pong", "2", "200")
    assert sids


def test_a_body_that_stops_coming_is_answered_408_and_the_stream_reset(h2_tern):
    tern = h2_tern("--http2", "h2c", "--body-timeout", "300")
    c = H2(tern.port)
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, [(":method", "POST"), (":path", "/echo"), (":scheme", "http"),
                              (":authority", "localhost"), ("content-length", "100")])
    c.conn.send_data(sid, b"x" * 10)   # and then nothing more
    c.flush()
    t0 = time.monotonic()
    c.read(lambda: c.of(h2.events.StreamReset, sid) or c.of(h2.events.StreamEnded, sid),
           "the 408")
    assert dict(c.of(h2.events.ResponseReceived, sid)[0].headers)[b":status"] == b"408"
    assert time.monotonic() - t0 < 5 * SLOW
    c.read(lambda: c.of(h2.events.StreamReset, sid), "the reset after the answer")
    assert c.of(h2.events.StreamReset, sid)[0].error_code == h2.errors.ErrorCodes.NO_ERROR
    # The connection serves on.
    sid = c.get("/ping")
    c.read(lambda: c.of(h2.events.StreamEnded, sid), "/ping's answer")
    c.sock.close()


# ---- memory ------------------------------------------------------------------

def test_idle_h2_connections_and_waiting_streams_are_small(h2_tern):
    # What an idle HTTP/2 connection over TLS costs, beside an idle
    # HTTP/1.1 one (test_tls.py's test_idle_tls_connections_are_small,
    # the same way: RSS growth over n connections, each after one answer,
    # past a warm-up), and what a stream waiting for its handler's answer
    # adds (a request, nghttp2's stream). The figures are in
    # docs/ARCHITECTURE.md. No idle timeout: the first connections wait
    # while the others open.
    tern = h2_tern("--idle-timeout", "600000")

    def idle_conn():
        c = H2(tern.tls_port, tls=True)
        sid = c.get("/ping")
        c.read(lambda: c.of(h2.events.StreamEnded, sid), "/ping's answer")
        return c

    conns = [idle_conn() for _ in range(50)]   # warm up
    rss0 = tern.rss_kib()
    n = 300 if SANITIZED else 1000
    conns += [idle_conn() for _ in range(n)]
    per_conn = (tern.rss_kib() - rss0) * 1024 / n
    print(f"RSS per idle h2 connection: {per_conn:.0f} bytes")
    # 100 streams (the most a connection takes) on each of 20 connections,
    # each waiting on a handler that answers in a minute; a PING's ack,
    # sent after them, says the server has read them all. The sockets are
    # closed whatever happens: a drain waits for streams in flight.
    try:
        rss1 = tern.rss_kib()
        waiting = conns[50:70]
        for c in waiting:
            for _ in range(100):
                c.get("/delay?ms=60000")
            c.conn.ping(b"waiting!")
            c.flush()
        for c in waiting:
            c.read(lambda: c.of(h2.events.PingAckReceived), "the PING's ack")
        per_stream = (tern.rss_kib() - rss1) * 1024 / (100 * len(waiting))
        print(f"RSS per h2 stream awaiting its handler: {per_stream:.0f} bytes")
        # none answered: each held its request (stream 1 was the /ping)
        assert not any(e.stream_id != 1 for c in waiting
                       for e in c.of(h2.events.ResponseReceived))
    finally:
        for c in conns:
            c.sock.close()
    if not SANITIZED:
        # nghttp2 allocates a 16 KiB frame buffer per session at its start
        assert per_conn < 48 * 1024
        assert per_stream < 4 * 1024
    assert curl("--http2", f"https://127.0.0.1:{tern.tls_port}/ping") == (b"pong", "2", "200")
