"""Pub/sub across nodes through a real redis-server (`tern serve --redis`,
--bridge's older name).

Checked: two nodes (one with one loop, one with two) deliver every publish
(WebSocket /pubsub and POST /publish) to every subscriber of both nodes
exactly once, each node's publishes in the order it made them; a node subscribes a topic's Redis channel only
while it has subscribers to it; Redis killed mid-stream leaves local
delivery going and /stats saying so; Redis restarted on the same port
brings cross-node delivery back without touching tern; a bad URL stops
tern serve with a clear message; a Redis that cannot be reached (nothing
on its port, a name that does not resolve, a DNS server that never
answers) is logged once with its reason however many tries, the tries
back off, and resolving never holds the loop."""
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

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server missing (scripts/install-deps.sh test)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, port):
        self.port = port
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.command("PING") == "+PONG":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def command(self, *args):
        """One command in RESP; returns the reply's first line, or the
        list of bulk strings of an array reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            req = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
            s.sendall(req.encode())
            f = s.makefile("rb")
            line = f.readline().decode().rstrip("\r\n")
            if line == "$-1":
                return None   # a nil reply
            if line.startswith("$"):
                return f.read(int(line[1:]) + 2)[:-2].decode()
            if not line.startswith("*"):
                return line
            items = []
            for _ in range(int(line[1:])):
                head = f.readline()
                if head.startswith(b":"):   # an integer (PUBSUB NUMSUB's counts)
                    items.append(int(head[1:]))
                    continue
                n = int(head[1:])
                items.append(f.read(n + 2)[:-2].decode())
            return items


@pytest.fixture
def redis():
    r = Redis(free_port())
    r.start()
    yield r
    r.stop()


def subscribe(ws, topic):
    ws.send(json.dumps({"op": "subscribe", "topic": topic}))
    ack = json.loads(ws.recv(timeout=5 * SLOW))
    assert ack["ok"] == "subscribe" and ack["topic"] == topic, ack


def recv_data(ws, timeout=5.0):
    """The next message's data, skipping acks."""
    while True:
        m = json.loads(ws.recv(timeout=timeout * SLOW))
        if "data" in m:
            return m["data"]


def http_publish(node, topic, body):
    return node.publish(topic, body)


def stats(node):
    return node.stats()



def channels(redis):
    """The channels subscribed, but the one presence across nodes keeps
    (src/app/presence_nodes.h: every node with --bridge, from its start)."""
    return sorted(c for c in redis.command("PUBSUB", "CHANNELS") if c != "tern:\x01\x01presence")


def subscribers(redis, channel):
    """How many Redis connections subscribe to channel: one per node whose
    subscription has landed (PUBSUB CHANNELS lists it from the first)."""
    return redis.command("PUBSUB", "NUMSUB", channel)[1]


def test_two_nodes_deliver_exactly_once_in_order(redis, tern_factory):
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url)
    b = tern_factory("--redis", url, "--threads", "2")
    wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
             "both nodes connected")
    assert channels(redis) == []   # nobody subscribes to anything yet
    subs = [connect(f"ws://127.0.0.1:{n.port}/pubsub") for n in (a, a, b, b, b)]
    try:
        for ws in subs:
            subscribe(ws, "px")
        wait_for(lambda: channels(redis) == ["tern:px"], "tern:px subscribed in Redis")
        pub_b = connect(f"ws://127.0.0.1:{b.port}/pubsub")
        sent = []
        for i in range(100):
            if i % 3 == 0:
                http_publish(a, "px", f"a{i}")
                sent.append(f"a{i}")
            elif i % 3 == 1:
                http_publish(b, "px", f"b{i}")
                sent.append(f"b{i}")
            else:
                pub_b.send(json.dumps({"op": "publish", "topic": "px", "key": f"k{i % 5}",
                                       "data": f"b{i}"}))
                assert json.loads(pub_b.recv(timeout=5 * SLOW))["ok"] == "publish"
                sent.append(f"b{i}")
        for ws in subs:
            got = [recv_data(ws) for _ in sent]
            # every message once; each node's publishes in their order
            assert sorted(got) == sorted(sent)
            for node in "ab":
                assert [m for m in got if m[0] == node] == [m for m in sent if m[0] == node]
        for ws in subs:   # and nothing twice
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)
        pub_b.close()
        st = stats(a)["redis"]
        assert st["received"] >= 50 and st["dropped"] == 0
    finally:
        for ws in subs:
            ws.close()
    # the last subscriber gone, the nodes leave the channel
    wait_for(lambda: channels(redis) == [], "tern:px unsubscribed in Redis")


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


def test_redis_lost_and_back(redis, tern_factory):
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url)
    b = tern_factory("--redis", url)
    wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
             "both nodes connected")
    wa = connect(f"ws://127.0.0.1:{a.port}/pubsub")
    wb = connect(f"ws://127.0.0.1:{b.port}/pubsub")
    try:
        subscribe(wa, "t")
        subscribe(wb, "t")
        wait_for(lambda: subscribers(redis, "tern:t") == 2, "both nodes subscribed")
        http_publish(a, "t", "before")
        assert recv_data(wa) == "before" and recv_data(wb) == "before"

        redis.stop()
        wait_for(lambda: not stats(a)["redis"]["connected"], "a sees Redis gone")
        # local delivery goes on; the other node misses it (counted)
        http_publish(a, "t", "alone")
        assert recv_data(wa) == "alone"
        with pytest.raises(TimeoutError):
            wb.recv(timeout=0.5)
        assert stats(a)["redis"]["dropped"] >= 1

        redis.start()   # the same port
        wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
                 "both nodes back", timeout=15)
        wait_for(lambda: channels(redis) == ["tern:t"], "subscribed again")
        # b's subscription may land a moment after a's: publish until b hears
        deadline = time.time() + 10 * SLOW
        got_b = None
        while got_b is None and time.time() < deadline:
            http_publish(a, "t", "after")
            assert recv_data(wa) == "after"
            try:
                got_b = recv_data(wb, timeout=0.3)
            except TimeoutError:
                pass
        assert got_b == "after"
        assert stats(a)["redis"]["reconnects"] >= 1
    finally:
        wa.close()
        wb.close()
    a.stop()
    assert "redis 127.0.0.1:%d lost" % redis.port in a.stderr


def test_bad_redis_url_is_refused():
    for bad in ("http://x", "redis://", "redis://h:0", "redis://h:70000", "redis://h:1/x",
                "redis://" + "h" * 300):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--redis", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode != 0, bad
        assert "--redis" in r.stderr and "URL" in r.stderr, (bad, r.stderr)


def test_redis_not_there_yet(tern_factory):
    """A node started before Redis serves locally, then joins."""
    port = free_port()
    a = tern_factory("--redis", f"redis://127.0.0.1:{port}")
    assert stats(a)["redis"]["connected"] is False
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        subscribe(ws, "early")
        http_publish(a, "early", "local")
        assert recv_data(ws) == "local"
        r = Redis(port)
        r.start()
        try:
            wait_for(lambda: stats(a)["redis"]["connected"], "connected", timeout=15)
            wait_for(lambda: channels(r) == ["tern:early"], "subscribed after connecting")
        finally:
            r.stop()


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


def pubsub_subscribe(ws, topic, **resume):
    """Subscribes over /pubsub; returns (the messages before the ack, the ack)."""
    ws.send(json.dumps(dict(op="subscribe", topic=topic, **resume)))
    before = []
    while True:
        m = json.loads(ws.recv(timeout=5 * SLOW))
        if m.get("ok") == "subscribe":
            return before, m
        assert "error" not in m, m
        before.append(m)


def recv_msg(ws, timeout=5.0):
    while True:
        m = json.loads(ws.recv(timeout=timeout * SLOW))
        if "data" in m:
            return m


def numbered_nodes(redis, tern_factory):
    """Two nodes whose topics have a history: numbered by Redis. Both have
    heard topic t once (its epoch) before the test goes on."""
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000")
    b = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000",
                     "--threads", "2")
    wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
             "both nodes connected")

    def heard(node):
        with connect(f"ws://127.0.0.1:{node.port}/pubsub") as ws:
            return pubsub_subscribe(ws, "t")[1]["seq"] >= 1
    # the publishing node hears its own message back from Redis too
    assert http_publish(a, "t", "m1")["seq"] == 0   # numbered later, by Redis
    wait_for(lambda: heard(a) and heard(b), "both nodes heard t")
    return a, b


def test_resume_on_another_node(redis, tern_factory):
    """Redis numbers a topic with a history, so a subscriber cut from one
    node resumes on the other with no gap and no duplicate."""
    a, b = numbered_nodes(redis, tern_factory)
    watcher = connect(f"ws://127.0.0.1:{a.port}/pubsub")
    pubsub_subscribe(watcher, "t")

    def publish(i):
        """From both nodes in turn, each numbered before the next is sent
        (a publish is numbered when Redis runs it, after the ack)."""
        http_publish(a if i % 2 else b, "t", "m%d" % i)
        assert recv_msg(watcher)["data"] == "m%d" % i
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t")
        epoch = ack["epoch"]
        assert ack["seq"] == 1, ack
        for i in range(2, 12):
            publish(i)
        got = [recv_msg(ws) for _ in range(10)]
        assert [m["seq"] for m in got] == list(range(2, 12))
        assert [m["data"] for m in got] == ["m%d" % i for i in range(2, 12)]
    for i in range(12, 32):   # while away
        publish(i)
    watcher.close()
    wait_for(lambda: stats(b)["redis"]["received"] >= 31, "b heard them")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        missed, ack = pubsub_subscribe(ws, "t", epoch=epoch, after="11")
        assert ack["resumed"] is True and ack["replayed"] == 20 and ack["epoch"] == epoch, ack
        assert [m["seq"] for m in missed] == list(range(12, 32))
        assert [m["data"] for m in missed] == ["m%d" % i for i in range(12, 32)]
        for i in range(32, 37):
            http_publish(a, "t", "m%d" % i)
        assert [recv_msg(ws)["seq"] for _ in range(5)] == list(range(32, 37))
        with pytest.raises(TimeoutError):   # nothing twice
            ws.recv(timeout=0.3)


def test_a_node_that_lost_redis_reads_back_what_it_missed(redis, tern_factory):
    """Its link cut, a node misses live messages; back, it reads them from
    the topic's stream, so its subscribers (and its history) have no gap."""
    a, b = numbered_nodes(redis, tern_factory)
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t")
        for i in range(2, 12):
            http_publish(a, "t", "m%d" % i)
        assert [recv_msg(ws)["seq"] for _ in range(10)] == list(range(2, 12))
        before = stats(b)["redis"]["reconnects"]
        # b's links (named tern-PID-sub/pub): it comes back after 75 ms at least
        links = [line for line in redis.command("CLIENT", "LIST").splitlines()
                 if f" name=tern-{b.proc.pid}-" in line]
        assert len(links) == 2, links
        for line in links:
            cid = line.split()[0].split("=")[1]
            assert redis.command("CLIENT", "KILL", "ID", cid) == ":1"
        for i in range(12, 32):
            assert http_publish(a, "t", "m%d" % i)["seq"] == 0
        wait_for(lambda: stats(b)["redis"]["reconnects"] > before, "b reconnected")
        http_publish(a, "t", "m32")
        got = [recv_msg(ws) for _ in range(21)]
        assert [m["seq"] for m in got] == list(range(12, 33))
        assert [m["data"] for m in got] == ["m%d" % i for i in range(12, 33)]
        assert stats(b)["redis"]["fills"] >= 1
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.3)
    # and its history is whole: a resume on b from the start
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        missed, ack = pubsub_subscribe(ws, "t", epoch=ack["epoch"], after="1")
        assert ack["resumed"] is True, ack
        assert [m["seq"] for m in missed] == list(range(2, 33))


def test_a_flushed_numbering_script_is_loaded_again(redis, tern_factory):
    """The numbering script goes by its SHA1 (EVALSHA); after SCRIPT FLUSH
    the next publish fails (counted as dropped) and the script is loaded
    again for the ones after it."""
    a, b = numbered_nodes(redis, tern_factory)
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        pubsub_subscribe(ws, "t")
        assert redis.command("SCRIPT", "FLUSH") == "+OK"
        before = stats(a)["redis"]["dropped"]
        http_publish(a, "t", "lost")
        wait_for(lambda: stats(a)["redis"]["dropped"] == before + 1, "the NOSCRIPT counted")
        http_publish(a, "t", "after")
        m = recv_msg(ws)
        assert m["data"] == "after" and m["seq"] == 2, m   # seq 1 was the warm-up


def test_a_subscriber_from_before_the_first_message_resumes(redis, tern_factory):
    """A client that subscribed before the topic's first message holds its
    node's epoch, which the node claimed in Redis (so the messages came
    numbered under it); its resume on that node gets what it missed."""
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000")
    wait_for(lambda: stats(a)["redis"]["connected"], "connected")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "fresh")
        assert ack["seq"] == 0, ack
        for i in range(1, 6):
            http_publish(a, "fresh", "m%d" % i)
        got = [recv_msg(ws) for _ in range(5)]
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]
    for i in range(6, 9):
        http_publish(a, "fresh", "m%d" % i)
    wait_for(lambda: stats(a)["redis"]["received"] >= 8, "a heard them")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        missed, again = pubsub_subscribe(ws, "fresh", epoch=ack["epoch"], after="5")
        assert again["resumed"] is True and again["replayed"] == 3, again
        assert again["epoch"] == ack["epoch"]   # claimed: Redis's too
        assert [m["data"] for m in missed] == ["m6", "m7", "m8"]
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:   # saw nothing at all
        missed, again = pubsub_subscribe(ws, "fresh", epoch=ack["epoch"], after="0")
        assert again["resumed"] is True and [m["seq"] for m in missed] == list(range(1, 9))


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


class HeldLink:
    """A TCP proxy to Redis whose replies (Redis to the node) can be held
    back: a node behind it stays behind the others while held."""

    def __init__(self, port):
        import threading
        self.flowing = threading.Event()
        self.flowing.set()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.port = self.srv.getsockname()[1]
        self.redis_port = port
        self.socks = [self.srv]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading
        while True:
            try:
                down, _ = self.srv.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.redis_port))
            self.socks += [down, up]
            threading.Thread(target=self._pipe, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down, True), daemon=True).start()

    def _pipe(self, src, dst, held):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if held:
                    self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.flowing.set()
        for s in self.socks:
            s.close()


def test_a_client_ahead_of_its_new_node_gets_no_duplicate(redis, tern_factory):
    """A subscriber that had seq 30 from node a resumes on node b, which
    has heard only up to 10 (its link to Redis held back): b sends nothing
    now, says so with the client's position, and when it catches up sends
    none of 11..30 again, only what comes after."""
    link = HeldLink(redis.port)
    try:
        url = f"redis://127.0.0.1:{redis.port}"
        a = tern_factory("--redis", url, "--feed", "off", "--pubsub-history", "1000")
        b = tern_factory("--redis", f"redis://127.0.0.1:{link.port}", "--feed", "off",
                         "--pubsub-history", "1000", "--threads", "2")
        wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
                 "both nodes connected")
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
            _, ack = pubsub_subscribe(ws, "t")
            for i in range(1, 11):
                http_publish(a, "t", "m%d" % i)
            assert [recv_msg(ws)["seq"] for _ in range(10)] == list(range(1, 11))
            wait_for(lambda: stats(b)["redis"]["received"] >= 10, "b heard 1..10")
            link.flowing.clear()   # b hears nothing more for now
            for i in range(11, 31):
                http_publish(a, "t", "m%d" % i)
            got = [recv_msg(ws) for _ in range(20)]
            assert [m["seq"] for m in got] == list(range(11, 31))
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
            _, ack = pubsub_subscribe(ws, "t")   # Redis's epoch, heard with the messages
            epoch = ack["epoch"]
            assert ack["seq"] == 30, ack
        assert stats(b)["redis"]["received"] == 10
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
            missed, ack = pubsub_subscribe(ws, "t", epoch=epoch, after="30")
            assert missed == [] and ack["epoch"] == epoch, ack
            assert ack["resumed"] is True and ack["replayed"] == 0 and ack["seq"] == 30, ack
            link.flowing.set()   # b catches up: 11..30 are not sent again
            wait_for(lambda: stats(b)["redis"]["received"] >= 30, "b heard 11..30")
            http_publish(a, "t", "m31")
            m = recv_msg(ws)
            assert (m["seq"], m["data"]) == (31, "m31"), m
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)
    finally:
        link.close()


def test_a_subscriber_from_before_the_first_message_resumes_on_another_node(redis,
                                                                              tern_factory):
    """The epoch a subscriber gets before a topic's first message is
    claimed in Redis by its node, so the topic is numbered under it and the
    subscriber may resume on any node (it used to be refused elsewhere)."""
    a, b = numbered_nodes(redis, tern_factory)
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "early")
        assert ack["seq"] == 0, ack
        wait_for(lambda: redis.command("HGET", "tern:n:early", "e") == ack["epoch"],
                 "the epoch claimed in Redis")
        for i in range(1, 6):
            http_publish(a, "early", "m%d" % i)
        got = [recv_msg(ws) for _ in range(5)]
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]
    for i in range(6, 9):
        http_publish(a, "early", "m%d" % i)
    wait_for(lambda: stats(b)["redis"]["received"] >= 8 + 1, "b heard them")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        missed, again = pubsub_subscribe(ws, "early", epoch=ack["epoch"], after="5")
        assert again["resumed"] is True and again["epoch"] == ack["epoch"], again
        assert [m["data"] for m in missed] == ["m6", "m7", "m8"]
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:   # saw nothing at all
        missed, again = pubsub_subscribe(ws, "early", epoch=ack["epoch"], after="0")
        assert again["resumed"] is True and [m["seq"] for m in missed] == list(range(1, 9))


def test_a_second_node_adopts_a_claimed_epoch(redis, tern_factory):
    """Two nodes' subscribers before the first message: the node that
    claims second adopts the first one's epoch, so both nodes' later
    subscribers hold one epoch."""
    a, b = numbered_nodes(redis, tern_factory)
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa:
        _, ack_a = pubsub_subscribe(wa, "both")
        wait_for(lambda: redis.command("HGET", "tern:n:both", "e") == ack_a["epoch"],
                 "a's claim")
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
            pubsub_subscribe(wb, "both")

            def b_epoch():
                with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
                    return pubsub_subscribe(ws, "both")[1]["epoch"]
            wait_for(lambda: b_epoch() == ack_a["epoch"], "b adopted a's epoch")
            http_publish(b, "both", "x")
            assert recv_msg(wa)["seq"] == 1 and recv_msg(wb)["seq"] == 1


def test_stats_names_the_node_that_sent_it(redis, tern_factory):
    # Issue #37: over Redis every node's "stats" reach every subscriber;
    # each message names its node (--node-name), so a reader (the page)
    # keeps its own node's figures instead of mixing them.
    url = f"redis://127.0.0.1:{redis.port}"
    a = tern_factory("--redis", url, "--node-name", "node-a")
    b = tern_factory("--redis", url, "--node-name", "node-b")
    wait_for(lambda: stats(a)["redis"]["connected"] and stats(b)["redis"]["connected"],
             "both nodes connected")
    assert stats(a)["node"] == "node-a" and stats(b)["node"] == "node-b"
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        subscribe(ws, "stats")
        seen = {}
        deadline = time.time() + 10 * SLOW
        while set(seen) != {"node-a", "node-b"} and time.time() < deadline:
            d = json.loads(recv_data(ws))
            assert d["node"] in ("node-a", "node-b"), d   # one name, a known one
            seen.setdefault(d["node"], []).append(d["uptime"])
        assert set(seen) == {"node-a", "node-b"}, seen
