"""tern's WebSocket client (tern_ws_connect), through `tern connect`, against
real servers and bad ones.

Real servers: tern serve's /ws echo (ws, wss with a certificate made here,
a Unix socket), Python `websockets`, Node's `ws` and Go's gorilla. Each
echo session sends lines from stdin and must print every one back, in
order, then close with 1000 (exit status 0); with --compress the server's
agreement to permessage-deflate is what makes it compressed both ways.

Bad servers, written here with plain sockets: one that refuses (nothing
listens), one that answers 101 with a wrong Sec-WebSocket-Accept, one that
closes in the middle of the handshake, one that never answers, one that
answers 403, and one that sends a masked frame after a good 101. Each must
end in the exit status and message `tern connect --help` documents.
"""
import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import SLOW, TERN_BIN, go_build
from test_ws_clients import node_client  # noqa: F401 (a fixture)

CLIENTS = Path(__file__).resolve().parent.parent / "clients"
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

EXIT_NORMAL, EXIT_USAGE, EXIT_CONNECT, EXIT_HANDSHAKE, EXIT_ABNORMAL = 0, 2, 3, 4, 5


def connect(url, *args, stdin="", timeout=30):
    """Runs `tern connect`; returns (exit status, stdout, stderr)."""
    p = subprocess.run([TERN_BIN, "connect", *args, url], input=stdin.encode(),
                       capture_output=True, timeout=timeout * SLOW)
    err = p.stderr.decode(errors="replace")
    assert "ERROR: AddressSanitizer" not in err, err
    assert "runtime error:" not in err, err
    assert "LeakSanitizer" not in err, err
    return p.returncode, p.stdout.decode(errors="replace"), err


LINES = ["hello", "", "x" * 125, "y" * 126, "z" * 70000, "caf\u00e9 \u2713", "last"]


def check_echo(url, *args):
    """An interactive session: the lines go out, every echo comes back,
    and only then does stdin end (a server may drop what it would echo
    once it has the client's close, as Python's websockets does)."""
    p = subprocess.Popen([TERN_BIN, "connect", *args, url], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write("".join(line + "\n" for line in LINES).encode())
    p.stdin.flush()
    got = []
    deadline = time.monotonic() + 20 * SLOW
    while len(got) < len(LINES) and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        got.append(line.decode().rstrip("\n"))
    p.stdin.close()
    try:
        p.wait(timeout=10 * SLOW)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    rest, err = p.stdout.read(), p.stderr.read().decode(errors="replace")
    assert "ERROR: AddressSanitizer" not in err and "LeakSanitizer" not in err, err
    assert got == LINES, err
    assert rest == b"", rest
    assert p.returncode == EXIT_NORMAL, err
    assert "closed 1000" in err
    assert ("(permessage-deflate)" in err) == ("--compress" in args), err
    return err


# ---- tern's own server --------------------------------------------------

def test_tern_echo_plain_and_compressed(tern):
    check_echo(f"ws://127.0.0.1:{tern.port}/ws")
    check_echo(f"ws://127.0.0.1:{tern.port}/ws", "--compress")


def test_tern_echo_over_a_unix_socket(tern_factory, tmp_path):
    sock = str(tmp_path / "t.sock")
    tern_factory("--unix", sock)
    check_echo(f"ws+unix:{sock}:/ws")
    code, _, err = connect(f"ws+unix:{tmp_path}/none.sock:/ws")
    assert code == EXIT_CONNECT, err


def test_binary_lines(tern):
    code, out, err = connect(f"ws://127.0.0.1:{tern.port}/ws", "--binary", stdin="\x00\x01b\n")
    assert code == EXIT_NORMAL, err
    assert out == "\x00\x01b\n"


def test_wss_verified_with_a_ca_file_and_refused_without(tern_factory, tmp_path):
    from test_tls import make_cert
    cert, key = make_cert(str(tmp_path), "c", "localhost", "DNS:localhost,IP:127.0.0.1")
    srv = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key)
    url = f"wss://localhost:{srv.tls_port}/ws"
    check_echo(url, "--ca-file", cert)
    check_echo(f"wss://127.0.0.1:{srv.tls_port}/ws", "--ca-file", cert, "--compress")
    # The system's CAs do not know this certificate.
    code, out, err = connect(url, stdin="hi\n")
    assert code == EXIT_HANDSHAKE, err
    assert "TLS certificate verification failed" in err, err
    assert "not signed by a trusted CA" in err, err
    # A name the certificate does not carry.
    code, out, err = connect(url, "--ca-file", cert, "--server-name", "other.test",
                             stdin="hi\n")
    assert code == EXIT_HANDSHAKE, err
    assert "verification failed" in err, err
    assert "does not carry the server's name" in err, err
    # --insecure takes it anyway.
    check_echo(url, "--insecure")


def test_headers_and_subprotocol_offer_reach_the_server(go_server):
    err = check_echo(f"ws://127.0.0.1:{go_server}/", "--subprotocol", "x-other",
                     "--subprotocol", "chat")
    assert "subprotocol chat" in err, err
    code, out, err = connect(f"ws://127.0.0.1:{go_server}/headers", "-H", "Cookie: a=1",
                             "-H", "Origin: http://example.test", stdin="")
    assert code == EXIT_NORMAL, err
    assert out == "cookie=a=1 origin=http://example.test\n"


def test_reserved_or_broken_headers_are_usage_errors(tern):
    code, _, err = connect(f"ws://127.0.0.1:{tern.port}/ws", "-H", "Sec-WebSocket-Key: x")
    assert code == EXIT_USAGE, err
    code, _, err = connect(f"ws://127.0.0.1:{tern.port}/ws", "-H", "no colon")
    assert code == EXIT_USAGE, err
    code, _, err = connect("http://127.0.0.1/")
    assert code == EXIT_USAGE, err


def test_server_initiated_close_ends_the_client(tern_factory):
    # --ws-max-message 10: a longer line makes the server close with 1009.
    srv = tern_factory("--ws-max-message", "10")
    code, out, err = connect(f"ws://127.0.0.1:{srv.port}/ws",
                             stdin="short\n" + "x" * 11 + "\nnever\n")
    assert code == EXIT_ABNORMAL, err
    assert out == "short\n"
    assert "closed 1009" in err, err


# ---- third-party servers -------------------------------------------------

def start_port_printer(argv, cwd=None, env=None):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    line = p.stdout.readline().decode()
    if not line.startswith("PORT "):
        p.kill()
        raise RuntimeError(f"{argv[0]} did not start: {line!r} {p.stderr.read()!r}")
    return p, int(line.split()[1])


PY_SERVER = r"""
import asyncio, sys
from websockets.asyncio.server import serve

async def echo(ws):
    async for m in ws:
        await ws.send(m)

def choose(ws, offered):
    return "chat" if "chat" in offered else None

async def main():
    async with serve(echo, sys.argv[1], 0, select_subprotocol=choose, max_size=None) as s:
        print("PORT", s.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()

asyncio.run(main())
"""


@pytest.fixture
def py_server():
    procs = []

    def start(host="127.0.0.1"):
        p, port = start_port_printer([sys.executable, "-c", PY_SERVER, host])
        procs.append(p)
        return port

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_python_websockets_server(py_server):
    port = py_server()
    check_echo(f"ws://127.0.0.1:{port}/")
    err = check_echo(f"ws://127.0.0.1:{port}/", "--compress", "-s", "chat")
    assert "subprotocol chat" in err


def test_ipv6(py_server):
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    check_echo(f"ws://[::1]:{py_server('::1')}/")


@pytest.fixture
def node_server(node_client):
    # node_client (test_ws_clients.py) installs the ws package when missing.
    p, port = start_port_printer([node_client[0], str(CLIENTS / "node" / "server.js")])
    yield port
    p.kill()
    p.wait()


def test_node_ws_server(node_server):
    check_echo(f"ws://127.0.0.1:{node_server}/")
    err = check_echo(f"ws://127.0.0.1:{node_server}/", "--compress", "-s", "chat")
    assert "subprotocol chat" in err


@pytest.fixture(scope="session")
def go_server_exe(tmp_path_factory):
    return go_build(tmp_path_factory, "./server", "wsserver")


@pytest.fixture
def go_server(go_server_exe):
    p, port = start_port_printer([go_server_exe])
    yield port
    p.kill()
    p.wait()


def test_gorilla_server(go_server):
    check_echo(f"ws://127.0.0.1:{go_server}/")
    check_echo(f"ws://127.0.0.1:{go_server}/", "--compress")


# ---- bad servers ---------------------------------------------------------

class BadServer:
    """One thread accepting on 127.0.0.1 and handing each connection to fn."""

    def __init__(self, fn):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.fn = fn
        self.conns = []
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            try:
                self.fn(c)
            except OSError:
                pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def read_head(c):
    data = b""
    while b"\r\n\r\n" not in data:
        b = c.recv(4096)
        if not b:
            break
        data += b
    return data.decode(errors="replace")


def accept_of(head):
    key = [l.split(":", 1)[1].strip() for l in head.split("\r\n")
           if l.lower().startswith("sec-websocket-key:")][0]
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


@pytest.fixture
def bad_server():
    servers = []

    def start(fn):
        s = BadServer(fn)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def test_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    code, _, err = connect(f"ws://127.0.0.1:{port}/")
    assert code == EXIT_CONNECT, err
    assert "Connection refused" in err, err


class FakeDns:
    """A DNS server on 127.0.0.1 (UDP) that answers every query with
    NXDOMAIN: the query's ID and question, QR=1, RCODE=3. Tests send
    traffic to loopback only, never to the system's DNS server."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.queries = []   # the names asked for
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @staticmethod
    def question(q):
        """The question section's end offset and its name (dotted)."""
        i, labels = 12, []
        while i < len(q) and q[i]:
            labels.append(q[i + 1:i + 1 + q[i]].decode(errors="replace"))
            i += 1 + q[i]
        return i + 1 + 4, ".".join(labels)   # the root label, QTYPE, QCLASS

    def serve(self):
        while not self.stopping:
            try:
                q, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            if len(q) < 12:
                continue
            end, name = self.question(q)
            self.queries.append(name)
            flags = 0x8000 | (q[2] & 0x01) << 8 | 0x0080 | 3   # QR, RD copied, RA, NXDOMAIN
            head = q[:2] + flags.to_bytes(2, "big") + b"\x00\x01" + b"\x00" * 6
            self.sock.sendto(head + q[12:end], peer)

    def close(self):
        self.stopping = True
        self.thread.join()
        self.sock.close()


@pytest.fixture
def fake_dns():
    d = FakeDns()
    yield d
    d.close()


def test_name_that_does_not_resolve(fake_dns):
    code, _, err = connect("ws://no-such-host.invalid/",
                           "--dns-server", f"127.0.0.1:{fake_dns.port}")
    assert code == EXIT_CONNECT, err
    assert any(q.startswith("no-such-host.invalid") for q in fake_dns.queries), fake_dns.queries


def test_wrong_accept_key(bad_server):
    def fn(c):
        read_head(c)
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\n"
                  b"Sec-WebSocket-Accept: dGhlIHNhbXBsZSBub25jZQ==AAAA\r\n\r\n")
        time.sleep(2)
    s = bad_server(fn)
    code, _, err = connect(f"ws://127.0.0.1:{s.port}/")
    assert code == EXIT_HANDSHAKE, err
    assert "wrong Sec-WebSocket-Accept" in err, err


def test_closes_mid_handshake(bad_server):
    def fn(c):
        read_head(c)
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgr")
        c.close()
    s = bad_server(fn)
    code, _, err = connect(f"ws://127.0.0.1:{s.port}/")
    assert code == EXIT_HANDSHAKE, err
    assert "closed the connection during the handshake" in err, err


def test_never_answers(bad_server):
    def fn(c):
        read_head(c)
        time.sleep(5)
    s = bad_server(fn)
    t0 = time.monotonic()
    code, _, err = connect(f"ws://127.0.0.1:{s.port}/", "--timeout", "500")
    assert code == EXIT_HANDSHAKE, err
    assert "no handshake answer within 500 ms" in err, err
    assert time.monotonic() - t0 < 4 * SLOW


def test_status_other_than_101(bad_server):
    def fn(c):
        read_head(c)
        c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        time.sleep(1)
    s = bad_server(fn)
    code, _, err = connect(f"ws://127.0.0.1:{s.port}/")
    assert code == EXIT_HANDSHAKE, err
    assert "answered 403 Forbidden" in err, err


def test_unoffered_subprotocol_or_extension_fails_the_handshake(bad_server):
    extra = iter([b"Sec-WebSocket-Protocol: chat\r\n",
                  b"Sec-WebSocket-Extensions: x-unknown\r\n"])

    def fn(c):
        head = read_head(c)
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Accept: " +
                  accept_of(head).encode() + b"\r\n" + next(extra) + b"\r\n")
        time.sleep(1)
    s = bad_server(fn)
    for what in ("subprotocol chat", "extensions"):
        code, _, err = connect(f"ws://127.0.0.1:{s.port}/")
        assert code == EXIT_HANDSHAKE, err
        assert what in err, err


def test_masked_frame_from_the_server_is_a_protocol_error(bad_server):
    got = []

    def fn(c):
        head = read_head(c)
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Accept: " +
                  accept_of(head).encode() + b"\r\n\r\n")
        c.sendall(bytes([0x81, 0x82, 1, 2, 3, 4, ord("h") ^ 1, ord("i") ^ 2]))
        c.settimeout(5)
        got.append(c.recv(64))
    s = bad_server(fn)
    # stdin stays open: the close must be the client's answer to the frame.
    p = subprocess.Popen([TERN_BIN, "connect", f"ws://127.0.0.1:{s.port}/"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        code = p.wait(timeout=15 * SLOW)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdin.close()
    out, err = p.stdout.read().decode(), p.stderr.read().decode(errors="replace")
    assert code == EXIT_ABNORMAL, err
    assert "closed 1002" in err, err
    assert out == ""
    # The client's close frame is masked: 0x88, then the mask bit and length 2+reason.
    frame = got[0]
    assert frame[0] == 0x88 and frame[1] & 0x80, frame
    key = frame[2:6]
    payload = bytes(b ^ key[i % 4] for i, b in enumerate(frame[6:]))
    assert payload[:2] == (1002).to_bytes(2, "big"), payload


def test_help_documents_the_exit_status():
    p = subprocess.run([TERN_BIN, "connect", "--help"], capture_output=True, text=True)
    assert p.returncode == 0
    for line in ("0  the connection closed normally", "3  no connection",
                 "4  connected but the handshake failed", "5  the connection ended abnormally"):
        assert line in p.stdout
