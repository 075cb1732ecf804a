"""Pub/sub across nodes through a real redis-server (`tern serve --redis`,
--bridge's older name): what Redis alone has. What every engine
guarantees (delivery across nodes, Redis lost and back, resume on another
node...) is in test_bridge_engines.py, run against Redis and NATS.

Checked: /stats and /metrics name the engine and keep Redis's former
names; a bad URL stops tern serve with a clear message; a Redis that
cannot be reached (nothing on its port, a name that does not resolve, a
DNS server that never answers) is logged once with its reason however
many tries, the tries back off, and resolving never holds the loop; a
flushed numbering script is loaded again; a node says it is connected
only once its pattern subscription runs."""
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN, wait_for
from engines import (Redis, free_port, http_publish, numbered_nodes, pubsub_subscribe,
                     recv_msg)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server missing (scripts/install-deps.sh test)")


@pytest.fixture
def redis():
    r = Redis(free_port())
    r.start()
    yield r
    r.stop()


def stats(node):
    return node.stats()


def test_bridge_names_the_engine_and_redis_keeps_its_former_names(redis, tern_factory):
    """--bridge redis:// (and --redis, its older name): /stats' "bridge"
    names the engine, "redis" holds the same counters (deprecated); /metrics
    has tern_bridge_*{engine="redis"} and tern_redis_* (deprecated)."""
    url = f"redis://127.0.0.1:{redis.port}"
    for node in (tern_factory("--bridge", url), tern_factory("--redis", url)):
        wait_for(lambda: stats(node)["bridge"]["connected"], "connected")
        st = stats(node)
        assert st["bridge"]["engine"] == "redis"
        assert {k: v for k, v in st["bridge"].items() if k != "engine"} == st["redis"]
        with urllib.request.urlopen(f"{node.admin_base}/metrics", timeout=5 * SLOW) as r:
            text = r.read().decode()
        for line in ('tern_bridge_configured{engine="redis"} 1', 'tern_bridge_up{engine="redis"} 1',
                     'tern_bridge_auth_refused{engine="redis"} 0',
                     "tern_redis_configured 1", "tern_redis_up 1", "tern_redis_auth_refused 0"):
            assert f"\n{line}\n" in text, line
        assert "# HELP tern_redis_up Deprecated: tern_bridge_up" in text


def test_bad_redis_url_is_refused():
    for bad in ("http://x", "redis://", "redis://h:0", "redis://h:70000", "redis://h:1/x",
                "redis://" + "h" * 300):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--redis", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode != 0, bad
        assert "--redis" in r.stderr and "URL" in r.stderr, (bad, r.stderr)


class LoggedNode:
    """A tern serve (one loop, an admin listener) whose whole stderr the
    test reads: on an unbuffered pipe, since a buffered readline of the
    first line (conftest's) may take the lines right behind it, which
    communicate() then never sees, and the bridge logs its first try at
    once."""

    def __init__(self, *args, preexec_fn=None):
        self.proc = subprocess.Popen(
            [TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
             "--admin-listen", "127.0.0.1:0", *args],
            stderr=subprocess.PIPE, bufsize=0, preexec_fn=preexec_fn)
        self.first = self.proc.stderr.readline().decode()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/ \(admin http://127\.0\.0\.1:(\d+)/\)",
                      self.first)
        if not m:
            self.proc.kill()
            raise AssertionError(f"tern did not start: {self.first!r}")
        self.base = f"http://127.0.0.1:{m.group(1)}"
        self.admin_base = f"http://127.0.0.1:{m.group(2)}"
        self.stderr = ""

    def stats(self):
        with urllib.request.urlopen(f"{self.admin_base}/stats", timeout=5 * SLOW) as r:
            return json.loads(r.read())

    def stop(self):
        """SIGTERM; the exit code, with all of stderr in self.stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10 * SLOW)
        self.stderr = self.first + err.decode(errors="replace")
        assert "Sanitizer" not in self.stderr and "runtime error:" not in self.stderr, self.stderr
        return self.proc.returncode


@pytest.fixture
def logged_node():
    nodes = []

    def start(*args, **kw):
        nodes.append(LoggedNode(*args, **kw))
        return nodes[-1]
    yield start
    for n in nodes:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()


def answers_quickly(node):
    """GET /healthz on the admin listener and GET / on the public one, each
    within half a second (both on the bridge's loop: --threads 1)."""
    for url in (f"{node.admin_base}/healthz", f"{node.base}/"):
        t0 = time.time()
        with urllib.request.urlopen(url, timeout=5 * SLOW) as r:
            assert r.status == 200
        assert time.time() - t0 < 0.5 * SLOW, url


def test_unreachable_redis_is_said_once_with_its_reason(logged_node):
    """Nothing listens on the port: the refusal is logged once, with
    connect(2)'s reason, while the bridge tries again and again (each try
    at debug level, its wait growing); Redis started there later is
    joined, and that recovery is logged once too."""
    port = free_port()
    a = logged_node("--redis", f"redis://127.0.0.1:{port}", "--log-level", "debug")
    time.sleep(3)
    assert stats(a)["redis"]["connected"] is False
    r = Redis(port)
    r.start()
    try:
        wait_for(lambda: stats(a)["redis"]["connected"], "connected", timeout=15)
    finally:
        r.stop()
    assert a.stop() == 0
    refused = f"redis 127.0.0.1:{port} unreachable: connect to 127.0.0.1: Connection refused"
    assert a.stderr.count(refused) == 1, a.stderr
    waits = [int(w) for w in re.findall(rf"redis 127\.0\.0\.1:{port} next try in (\d+) ms",
                                        a.stderr)]
    assert len(waits) >= 4, a.stderr     # 0.1 + 0.2 + 0.4 + 0.8 s (+-25 %) within 3 s
    assert waits[3] > waits[0] * 4, waits   # exponential
    assert a.stderr.count(f"redis 127.0.0.1:{port} connected again") == 1, a.stderr


def test_the_backoff_starts_afresh_only_after_a_stable_link(logged_node):
    """The tries of an outage back off (100 ms, doubling); once the link
    has stayed up for 3 s, the next outage's first try comes after 100 ms
    again, not where the last outage left off."""
    port = free_port()
    a = logged_node("--redis", f"redis://127.0.0.1:{port}", "--log-level", "debug")
    time.sleep(1.6)
    r = Redis(port)
    r.start()
    try:
        wait_for(lambda: stats(a)["redis"]["connected"], "connected", timeout=15)
        time.sleep(3.5)
    finally:
        r.stop()
    wait_for(lambda: not stats(a)["redis"]["connected"], "Redis gone")
    time.sleep(0.5)
    assert a.stop() == 0
    before, _, after = a.stderr.partition(f"redis 127.0.0.1:{port} connected again")
    tries = rf"redis 127\.0\.0\.1:{port} next try in (\d+) ms"
    first = [int(w) for w in re.findall(tries, before)]
    second = [int(w) for w in re.findall(tries, after)]
    assert len(first) >= 4 and first[-1] >= 600, first
    assert second and second[0] <= 125, second
    assert f"redis 127.0.0.1:{port} lost: " in after, after


def test_unresolvable_redis_host_is_said_once_and_the_loop_serves(logged_node):
    """A host name that does not resolve: c-ares' reason, logged once,
    however many tries; resolving never holds the loop, which answers
    HTTP throughout."""
    a = logged_node("--redis", "redis://no-such-host.invalid:6379", "--log-level", "debug")
    deadline = time.time() + 3
    while time.time() < deadline:
        answers_quickly(a)
        time.sleep(0.1)
    assert stats(a)["redis"]["connected"] is False
    assert a.stop() == 0
    said = re.findall(r"redis no-such-host\.invalid:6379 unreachable: "
                      r"cannot resolve no-such-host\.invalid: ([^;\n]+);", a.stderr)
    assert len(said) == 1, a.stderr
    assert said[0] in ("Domain name not found", "DNS server returned answer with no data",
                       "Could not contact DNS servers", "Timeout while contacting DNS servers",
                       "no answer in time"), said
    assert a.stderr.count("redis no-such-host.invalid:6379 next try in") >= 3, a.stderr


def own_resolv_conf(path):
    """A preexec_fn that gives the child a mount namespace of its own, in
    which /etc/resolv.conf is path (the host's stays untouched)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, ms_private, clone_newns = 0x1000, 0x4000, 0x40000, 0x20000

    def pre():
        if (libc.unshare(clone_newns) != 0 or
                libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0 or
                libc.mount(str(path).encode(), b"/etc/resolv.conf", None, ms_bind, None) != 0):
            os._exit(99)
    return pre


def test_a_dns_server_that_never_answers_never_holds_the_loop(logged_node, tmp_path):
    """The system's DNS server (here one that reads queries and never
    answers, in tern's own /etc/resolv.conf) is waited for by c-ares on the
    loop, not by a blocking getaddrinfo: HTTP is answered at once all the
    while, and the timeout (the bridge's 5 s, or c-ares' own) is logged
    once."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("needs a mount namespace (root) for a resolv.conf of its own")
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    addr = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    silent.bind((addr, 53))
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {addr}\noptions timeout:1 attempts:1\n")
    a = logged_node("--redis", "redis://redis.example.test:6379", "--log-level", "debug",
                    preexec_fn=own_resolv_conf(conf))
    try:
        deadline = time.time() + 7   # past the bridge's 5 s for a name
        while time.time() < deadline:
            answers_quickly(a)
            time.sleep(0.1)
        assert stats(a)["redis"]["connected"] is False
    finally:
        assert a.stop() == 0, a.stderr
    silent.setblocking(False)
    queries = 0
    try:
        while silent.recv(512):
            queries += 1
    except BlockingIOError:
        pass
    silent.close()
    assert queries >= 2, queries   # asked, more than once
    said = re.findall(r"redis redis\.example\.test:6379 unreachable: "
                      r"cannot resolve redis\.example\.test: ([^;\n]+);", a.stderr)
    assert said in (["Timeout while contacting DNS servers"], ["no answer in time"]), a.stderr


def test_a_flushed_numbering_script_is_loaded_again(redis, tern_factory):
    """The numbering script goes by its SHA1 (EVALSHA); after SCRIPT FLUSH
    the next publish fails (counted as dropped) and the script is loaded
    again for the ones after it."""
    a, b = numbered_nodes(tern_factory, redis.url)
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        pubsub_subscribe(ws, "t")
        assert redis.command("SCRIPT", "FLUSH") == "+OK"
        before = stats(a)["redis"]["dropped"]
        http_publish(a, "t", "lost")
        wait_for(lambda: stats(a)["redis"]["dropped"] == before + 1, "the NOSCRIPT counted")
        http_publish(a, "t", "after")
        m = recv_msg(ws)
        assert m["data"] == "after" and m["seq"] == 2, m   # seq 1 was the warm-up


def test_connected_only_once_numbered_messages_are_heard(redis, tern_factory):
    """A node says it is connected (and sends a topic with a history to be
    numbered by Redis) only once its pattern subscription runs in Redis:
    before, what Redis numbered went by unheard, also the node's own
    publishes, and a node new to the topic never read them back. Redis
    paused (CLIENT PAUSE) accepts the links but runs no command."""
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000")
    wait_for(lambda: stats(a)["redis"]["connected"], "a connected")
    assert redis.command("CLIENT", "PAUSE", "1500", "ALL") == "+OK"
    paused = time.time()
    b = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000")
    while time.time() < paused + 1.0:
        assert not stats(b)["redis"]["connected"], "connected while its PSUBSCRIBE waits"
        time.sleep(0.05)
    wait_for(lambda: stats(b)["redis"]["connected"], "b connected")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        pubsub_subscribe(ws, "t")
        http_publish(b, "t", "m1")   # numbered by Redis, heard back by b
        m = recv_msg(ws)
        assert m["data"] == "m1" and m["seq"] == 1, m

