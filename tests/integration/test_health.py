"""Liveness and readiness on the admin listener (issue #27): /healthz
answers while the process does; /readyz is 503 with its reason while
draining (after SIGTERM), while a listener is not accepting and while a
configured Redis is down."""
import http.client
import resource
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import SLOW, Server, http_get, read_response, wait_for
from engines import Redis, free_port




def redis_up(t):
    """tern_redis_up in /metrics (None when Redis is not configured)."""
    text = http_get(t.admin_base, "/metrics")[1]
    for line in text.splitlines():
        if line.startswith("tern_redis_up "):
            return int(line.split()[1])
    assert "\ntern_redis_configured 0\n" in text
    return None


def test_health_and_ready_on_a_plain_server(tern):
    for path in ("/healthz", "/health"):
        assert http_get(tern.admin_base, path) == (200, "ok\n")
    for path in ("/readyz", "/ready"):
        assert http_get(tern.admin_base, path) == (200, "ready\n")
    assert http_get(tern.base, "/ping") == (200, "pong")
    assert http_get(tern.base, "/readyz")[0] == 404   # the admin listener's only
    assert redis_up(tern) is None


def test_not_ready_while_a_listener_is_not_accepting():
    """Out of descriptors, the public listener backs off (100 ms at a time,
    while clients wait in the kernel's queue): /readyz says so, and
    /metrics counts it, on an admin connection opened before; with room
    again it is ready again. (The limit is set before the start: io_uring's
    accept does not see a limit lowered later.)"""
    limit = 48
    t = Server(["--threads", "2"],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
    admin = http.client.HTTPConnection("127.0.0.1", t.admin_port, timeout=5 * SLOW)
    clients = []
    try:
        def ask(path):
            admin.request("GET", path)
            r = admin.getresponse()
            return r.status, r.read().decode()

        def paused():
            text = ask("/metrics")[1]
            return int(next(line.split()[1] for line in text.splitlines()
                            if line.startswith("tern_listeners_paused ")))

        assert ask("/readyz") == (200, "ready\n")
        assert paused() == 0
        # More clients than descriptors left, and some for each loop's
        # accept queue (SO_REUSEPORT spreads them).
        for _ in range(limit - t.open_fds() + 8):
            clients.append(socket.create_connection(("127.0.0.1", t.port), timeout=5 * SLOW))
        wait_for(lambda: ask("/readyz") == (
            503, "not ready: a listener is not accepting (out of descriptors)\n"),
            "/readyz to say a listener is not accepting")
        assert paused() >= 1
        for c in clients:
            c.close()
        clients = []
        wait_for(lambda: ask("/readyz") == (200, "ready\n"), "/readyz ready again")
        assert paused() == 0
    finally:
        for c in clients:
            c.close()
        admin.close()
        assert t.stop() == 0, t.stderr


def test_not_ready_while_draining(tern):
    """A request in flight holds the drain open: meanwhile readiness is 503,
    liveness 200, no new connection is accepted, the request finishes and
    the server exits 0."""
    s = socket.create_connection(("127.0.0.1", tern.port), timeout=5 * SLOW)
    s.sendall(b"GET /delay?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    tern.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: http_get(tern.admin_base, "/readyz")[0] == 503, "readyz 503")
    assert http_get(tern.admin_base, "/readyz") == (503, "not ready: draining\n")
    assert http_get(tern.admin_base, "/healthz") == (200, "ok\n")
    with urllib.request.urlopen(f"{tern.admin_base}/metrics", timeout=5 * SLOW) as r:
        assert "\ntern_draining 1\n" in r.read().decode()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", tern.port), timeout=2).recv(1)
    status, _, body, _ = read_response(s, timeout=5 * SLOW)
    assert (status, body) == (200, b"done\n")
    s.close()
    assert tern.proc.wait(timeout=10 * SLOW) == 0


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server missing")
def test_not_ready_while_redis_is_down(tern_factory):
    port = free_port()
    t = tern_factory("--redis", f"redis://127.0.0.1:{port}")
    assert http_get(t.admin_base, "/readyz") == (503, "not ready: bridge (redis) down\n")
    assert http_get(t.admin_base, "/healthz") == (200, "ok\n")
    assert redis_up(t) == 0
    r = Redis(port)
    r.start()
    try:
        wait_for(lambda: http_get(t.admin_base, "/readyz")[0] == 200, "ready with redis", 15)
        assert http_get(t.admin_base, "/readyz") == (200, "ready\n")
        assert redis_up(t) == 1
        r.stop()
        wait_for(lambda: http_get(t.admin_base, "/readyz")[0] == 503, "not ready without redis")
        assert redis_up(t) == 0
    finally:
        r.stop()
