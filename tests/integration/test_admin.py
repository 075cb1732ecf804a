"""tern serve's exposure (issue #26): the bench routes only with
--bench-routes, and POST /publish and GET /stats only on the admin
listener (--admin-listen), publishing only with the --api-key-file key."""
import json
import re
import socket
import subprocess
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN, read_response

BENCH = [("GET", "/echo?size=3"), ("POST", "/echo"), ("GET", "/stream"), ("POST", "/upload"),
         ("GET", "/delay?ms=0"), ("GET", "/item/7"), ("GET", "/ws"), ("GET", "/ws/broadcast"),
         ("GET", "/ws/room/r"), ("GET", "/fanout"), ("GET", "/fanout/sub"), ("GET", "/fanout/pub"),
         ("GET", "/fanout/pub-keyed")]


def ask(port, method, path, body=b"", headers=()):
    s = socket.create_connection(("127.0.0.1", port), timeout=5 * SLOW)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  f"{extra}Connection: close\r\n\r\n".encode() + body)
        status, h, b, _ = read_response(s, timeout=5 * SLOW)
        return status, h, b
    finally:
        s.close()


def upgrade(port, path):
    return ask(port, "GET", path, headers=[("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                           ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                                           ("Sec-WebSocket-Version", "13")])[0]


def test_bench_routes_are_404_without_the_flag(tern_factory):
    t = tern_factory(bench_routes=False)
    for method, path in BENCH:
        status = upgrade(t.port, path) if path.startswith(("/ws", "/fanout")) \
            else ask(t.port, method, path, b"x" if method == "POST" else b"")[0]
        assert status == 404, (method, path, status)
    # what stays: the page, /pubsub, /ping
    assert ask(t.port, "GET", "/")[0] == 200
    assert ask(t.port, "GET", "/market")[0] == 200
    assert ask(t.port, "GET", "/ping")[2] == b"pong"
    assert upgrade(t.port, "/pubsub") == 101


def test_bench_routes_work_with_the_flag(tern_factory):
    t = tern_factory("--bench-routes")
    assert ask(t.port, "GET", "/echo?size=3")[2] == b"xxx"
    assert ask(t.port, "POST", "/echo", b"hi")[2] == b"hi"
    assert ask(t.port, "GET", "/item/7")[0] == 200
    for path in ("/ws", "/ws/broadcast", "/ws/room/r", "/fanout", "/fanout/sub", "/fanout/pub",
                 "/fanout/pub-keyed"):
        assert upgrade(t.port, path) == 101, path
    with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
        ws.send("hello")
        assert ws.recv(timeout=5 * SLOW) == "hello"


def test_publish_and_stats_are_not_on_the_public_port(tern):
    assert ask(tern.port, "GET", "/stats")[0] == 404
    assert ask(tern.port, "POST", "/publish/market", b"x",
               [("Authorization", f"Bearer {tern.api_key}")])[0] == 404
    # a page elsewhere posting with the visitor's browser: nothing there
    status, _, body = ask(tern.port, "POST", "/publish/market", b"x",
                          [("Origin", "https://evil.example"),
                           ("Content-Type", "text/plain")])
    assert status == 404, body


def test_stats_on_the_admin_port_needs_no_key(tern):
    assert tern.admin_port and tern.admin_port != tern.port
    status, h, body = ask(tern.admin_port, "GET", "/stats")
    assert status == 200 and h["content-type"] == "application/json"
    st = json.loads(body)
    assert st["threads"] == 1 and "total" in st and len(st["each"]) == 1
    # only /publish and /stats there
    assert ask(tern.admin_port, "GET", "/ping")[0] == 404
    assert ask(tern.admin_port, "GET", "/")[0] == 404


def test_publish_with_the_key_reaches_a_subscriber(tern_factory):
    t = tern_factory("--threads", "2", "--feed", "off")
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "news"}))
        assert json.loads(ws.recv(timeout=5 * SLOW))["ok"] == "subscribe"
        status, _, body = ask(t.admin_port, "POST", "/publish/news", b"hello",
                              [("Authorization", f"Bearer {t.api_key}")])
        assert status == 200, body
        assert json.loads(body) == {"seq": 1, "subscribers": 1}
        assert json.loads(ws.recv(timeout=5 * SLOW)) == {"topic": "news", "seq": 1,
                                                         "data": "hello"}


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer ", "Basic eDp5", "bearer"])
def test_publish_with_a_wrong_or_no_key_is_401(tern, auth):
    headers = [("Authorization", auth)] if auth is not None else []
    status, h, body = ask(tern.admin_port, "POST", "/publish/news", b"x", headers)
    assert status == 401, body
    assert h["www-authenticate"] == "Bearer"
    # a key that only starts like the right one
    status, _, _ = ask(tern.admin_port, "POST", "/publish/news", b"x",
                       [("Authorization", f"Bearer {tern.api_key}x")])
    assert status == 401


def test_publish_without_a_key_file_is_403(tern_factory):
    t = tern_factory(api_key=False)
    status, _, body = ask(t.admin_port, "POST", "/publish/news", b"x",
                          [("Authorization", "Bearer anything")])
    assert status == 403 and b"--api-key-file" in body, body
    assert ask(t.admin_port, "GET", "/stats")[0] == 200


def test_admin_listen_off(tern_factory):
    t = tern_factory("--admin-listen", "off")
    assert t.admin_port is None
    assert ask(t.port, "GET", "/stats")[0] == 404


def test_admin_listen_default_and_bad_values(tmp_path):
    out = subprocess.run([TERN_BIN, "serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--bench-routes", "--admin-listen", "--api-key-file"):
        assert flag in out
    assert "127.0.0.1:9090" in out
    for bad in ("9090", "localhost", "host:", "host:99999", "::1:9090", "[::1]"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--admin-listen", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "--admin-listen" in r.stderr, (bad, r.stderr)
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--api-key-file",
                        str(tmp_path / "missing")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "--api-key-file" in r.stderr, r.stderr
    (tmp_path / "empty").write_text("\n")
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--api-key-file",
                        str(tmp_path / "empty")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "no key" in r.stderr, r.stderr


def test_admin_port_in_use_is_an_error(tern):
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--admin-listen",
                        f"127.0.0.1:{tern.admin_port}"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 1 and "--admin-listen" in r.stderr, r.stderr


def test_the_listening_line_names_the_admin_listener():
    # the back end stays last
    p = subprocess.Popen([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--admin-listen",
                          "127.0.0.1:0"], stderr=subprocess.PIPE)
    try:
        line = p.stderr.readline().decode()
    finally:
        p.terminate()
        assert p.wait(10 * SLOW) == 0
    assert re.search(r"listening on http://127\.0\.0\.1:\d+/ \(admin http://127\.0\.0\.1:\d+/\) "
                     r"\(1 thread, \w+\)$", line.rstrip()), line
