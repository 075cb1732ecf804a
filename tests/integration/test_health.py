"""Liveness and readiness on the admin listener (issue #27): /healthz
answers while the process does; /readyz is 503 with its reason while
draining (after SIGTERM) and while a configured Redis is down."""
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import SLOW, read_response
from test_redis import Redis, free_port


def get(base, path):
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=5 * SLOW) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(cond, what, timeout=10.0):
    deadline = time.time() + timeout * SLOW
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def redis_up(t):
    """tern_redis_up in /metrics (None when Redis is not configured)."""
    text = get(t.admin_base, "/metrics")[1]
    for line in text.splitlines():
        if line.startswith("tern_redis_up "):
            return int(line.split()[1])
    assert "\ntern_redis_configured 0\n" in text
    return None


def test_health_and_ready_on_a_plain_server(tern):
    for path in ("/healthz", "/health"):
        assert get(tern.admin_base, path) == (200, "ok\n")
    for path in ("/readyz", "/ready"):
        assert get(tern.admin_base, path) == (200, "ready\n")
    assert get(tern.base, "/ping") == (200, "pong")
    assert get(tern.base, "/readyz")[0] == 404   # the admin listener's only
    assert redis_up(tern) is None


def test_not_ready_while_draining(tern):
    """A request in flight holds the drain open: meanwhile readiness is 503,
    liveness 200, no new connection is accepted, the request finishes and
    the server exits 0."""
    s = socket.create_connection(("127.0.0.1", tern.port), timeout=5 * SLOW)
    s.sendall(b"GET /delay?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    tern.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: get(tern.admin_base, "/readyz")[0] == 503, "readyz 503")
    assert get(tern.admin_base, "/readyz") == (503, "not ready: draining\n")
    assert get(tern.admin_base, "/healthz") == (200, "ok\n")
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
    assert get(t.admin_base, "/readyz") == (503, "not ready: redis down\n")
    assert get(t.admin_base, "/healthz") == (200, "ok\n")
    assert redis_up(t) == 0
    r = Redis(port)
    r.start()
    try:
        wait_for(lambda: get(t.admin_base, "/readyz")[0] == 200, "ready with redis", 15)
        assert get(t.admin_base, "/readyz") == (200, "ready\n")
        assert redis_up(t) == 1
        r.stop()
        wait_for(lambda: get(t.admin_base, "/readyz")[0] == 503, "not ready without redis")
        assert redis_up(t) == 0
    finally:
        r.stop()
