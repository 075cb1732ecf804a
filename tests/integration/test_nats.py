"""Pub/sub across nodes through a real nats-server (`tern serve --bridge
nats://...`: the NATS engine, src/pubsub/nats.c).

Checked: two nodes (one with one loop, one with two) deliver every publish
(WebSocket /pubsub and POST /publish) to every subscriber of both nodes
exactly once, each node's publishes in the order it made them, on a topic
whose name NATS would split ('.') ; a node subscribes a topic's subject
only while it has subscribers to it; nats-server killed mid-stream leaves
local delivery going, /readyz 503 and the loss logged, and restarted on
the same port brings cross-node delivery back; NATS over TLS (tls://)
connects to a server whose certificate verifies against ?ca= and is
refused, with OpenSSL's reason, without it; wrong credentials are
logged with NATS's reason, /readyz 503, and the right ones (in the URL or
a file) connect; a cluster's URL list connects to a server that is up,
and a node whose server is killed in a three-server cluster (routes on
127.0.0.1) moves to another and goes on delivering, in order and never
twice; a bad URL stops tern serve with a clear message."""
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN, wait_for
from test_redis import free_port, recv_data, subscribe   # the cross-node helpers
from test_tls import make_cert

pytestmark = pytest.mark.skipif(shutil.which("nats-server") is None,
                                reason="nats-server missing (scripts/install-deps.sh test)")


class Nats:
    """A nats-server on 127.0.0.1 (port, and a monitoring port for its
    subscriptions); auth: extra arguments (--user/--pass, --auth)."""

    def __init__(self, port, *auth):
        self.port = port
        self.monitor = free_port()
        self.auth = list(auth)   # or a cluster's arguments
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor),
             *self.auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, "nats-server answers")

    def answers(self):
        try:
            self.get("/varz")
            return True
        except OSError:
            return False

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}{path}", timeout=2) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def subjects(self):
        """Every client's subscriptions, one entry per subscription, but
        those of the subject presence across nodes keeps
        (src/app/presence_nodes.h: every node with --bridge, from its
        start)."""
        conns = self.get("/connz?subs=1")["connections"] or []
        return sorted(s for c in conns for s in c.get("subscriptions_list", [])
                      if s != "tern.%01%01presence")

    def clients(self):
        """The names of the clients connected (tern's: tern-PID)."""
        return [c.get("name", "") for c in self.get("/connz")["connections"] or []]


@pytest.fixture
def cluster():
    """Three nats-servers routed to each other on 127.0.0.1."""
    routes = [free_port() for _ in range(3)]
    servers = [Nats(free_port(), "--cluster_name", "tern", "--cluster",
                    f"nats://127.0.0.1:{routes[i]}", "--routes",
                    ",".join(f"nats://127.0.0.1:{r}" for j, r in enumerate(routes) if j != i))
               for i in range(3)]
    for s in servers:
        s.start()
    wait_for(lambda: all(s.get("/routez")["num_routes"] == 2 for s in servers), "routes up")
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
def nats():
    n = Nats(free_port())
    n.start()
    yield n
    n.stop()


def bridge(node):
    """/stats' "bridge" object: NATS's counters, named; "redis" is Redis's alone."""
    st = node.stats()
    assert st["bridge"]["engine"] == "nats" and st["redis"] is None, st
    return st["bridge"]


def metrics(node):
    """/metrics' text."""
    with urllib.request.urlopen(f"{node.admin_base}/metrics", timeout=5 * SLOW) as r:
        return r.read().decode()


def readyz(node):
    """/readyz's status and body."""
    try:
        with urllib.request.urlopen(f"{node.admin_base}/readyz", timeout=5 * SLOW) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_two_nodes_deliver_exactly_once_in_order(nats, tern_factory):
    url = f"nats://127.0.0.1:{nats.port}"
    a = tern_factory("--bridge", url)
    b = tern_factory("--bridge", url, "--threads", "2")
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both nodes connected")
    # what the nodes published before they connected (their feed) is dropped
    dropped = bridge(a)["dropped"]
    assert nats.subjects() == []   # nobody subscribes to anything yet
    subs = [connect(f"ws://127.0.0.1:{n.port}/pubsub") for n in (a, a, b, b, b)]
    try:
        for ws in subs:
            subscribe(ws, "p.x")
        # one subscription per node, the '.' escaped: one token, not two
        wait_for(lambda: nats.subjects() == ["tern.p%2Ex"] * 2, "both nodes subscribed")
        pub_b = connect(f"ws://127.0.0.1:{b.port}/pubsub")
        sent = []
        for i in range(100):
            if i % 3 == 0:
                a.publish("p.x", f"a{i}")
                sent.append(f"a{i}")
            elif i % 3 == 1:
                b.publish("p.x", f"b{i}")
                sent.append(f"b{i}")
            else:
                pub_b.send(json.dumps({"op": "publish", "topic": "p.x", "key": f"k{i % 5}",
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
        st = bridge(a)
        assert st["received"] >= 50 and st["dropped"] == dropped
    finally:
        for ws in subs:
            ws.close()
    # the last subscriber gone, the nodes leave the subject
    wait_for(lambda: nats.subjects() == [], "tern.p%2Ex unsubscribed in NATS")


def test_nats_lost_and_back(nats, tern_factory):
    url = f"nats://127.0.0.1:{nats.port}"
    a = tern_factory("--bridge", url)
    b = tern_factory("--bridge", url)
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both nodes connected")
    assert readyz(a) == (200, "ready\n")
    wa = connect(f"ws://127.0.0.1:{a.port}/pubsub")
    wb = connect(f"ws://127.0.0.1:{b.port}/pubsub")
    try:
        subscribe(wa, "t")
        subscribe(wb, "t")
        wait_for(lambda: nats.subjects() == ["tern.t"] * 2, "both nodes subscribed")
        a.publish("t", "before")
        assert recv_data(wa) == "before" and recv_data(wb) == "before"

        nats.stop()
        wait_for(lambda: not bridge(a)["connected"], "a sees NATS gone")
        assert readyz(a) == (503, "not ready: bridge (nats) down\n")
        text = metrics(a)
        assert 'tern_bridge_up{engine="nats"} 0\n' in text
        assert 'tern_bridge_configured{engine="nats"} 1\n' in text
        assert "\ntern_redis_configured 0\n" in text and "tern_redis_up" not in text
        # local delivery goes on; the other node misses it (counted)
        a.publish("t", "alone")
        assert recv_data(wa) == "alone"
        with pytest.raises(TimeoutError):
            wb.recv(timeout=0.5)
        assert bridge(a)["dropped"] >= 1

        nats.start()   # the same port
        wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both nodes back",
                 timeout=15)
        wait_for(lambda: nats.subjects() == ["tern.t"] * 2, "subscribed again")
        assert readyz(a) == (200, "ready\n")
        assert 'tern_bridge_up{engine="nats"} 1\n' in metrics(a)
        a.publish("t", "after")
        assert recv_data(wa) == "after" and recv_data(wb) == "after"
        assert bridge(a)["reconnects"] >= 1
    finally:
        wa.close()
        wb.close()
    a.stop()
    assert f"nats 127.0.0.1:{nats.port} lost" in a.stderr
    assert f"nats 127.0.0.1:{nats.port} connected again" in a.stderr


def test_nats_not_there_yet(tern_factory):
    """A node started before NATS serves locally, then joins."""
    port = free_port()
    a = tern_factory("--bridge", f"nats://127.0.0.1:{port}")
    assert bridge(a)["connected"] is False
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        subscribe(ws, "early")
        a.publish("early", "local")
        assert recv_data(ws) == "local"
        n = Nats(port)
        n.start()
        try:
            wait_for(lambda: bridge(a)["connected"], "connected", timeout=15)
            wait_for(lambda: n.subjects() == ["tern.early"], "subscribed after connecting")
        finally:
            n.stop()
    a.stop()
    assert a.stderr.count(f"nats 127.0.0.1:{port} unreachable") == 1, a.stderr


def test_wrong_credentials_are_said_and_not_ready(tern_factory, tmp_path):
    n = Nats(free_port(), "--user", "tern", "--pass", "s3cret")
    n.start()
    try:
        bad = tern_factory("--bridge", f"nats://tern:wrong@127.0.0.1:{n.port}")
        wait_for(lambda: bridge(bad)["auth_refused"], "the password refused")
        assert readyz(bad) == (503, "not ready: bridge (nats) auth failed\n")
        assert bridge(bad)["connected"] is False
        good = tern_factory("--bridge", f"nats://tern:s3cret@127.0.0.1:{n.port}")
        pw = tmp_path / "pw"
        pw.write_text("s3cret\n")
        from_file = tern_factory("--bridge",
                                 f"nats://tern:@127.0.0.1:{n.port}?password_file={pw}")
        wait_for(lambda: bridge(good)["connected"] and bridge(from_file)["connected"],
                 "the right password connects")
        assert readyz(good) == (200, "ready\n")
        bad.stop()
    finally:
        n.stop()
    line = [x for x in bad.stderr.splitlines() if "refused" in x]
    assert len(line) == 1, bad.stderr   # said once, however many tries
    assert "[error]" in line[0] and "refused the user and password" in line[0], line
    assert "uthorization" in line[0], line   # NATS's own words
    assert "wrong" not in bad.stderr and "s3cret" not in bad.stderr


def test_a_token_from_a_file(tern_factory, tmp_path):
    n = Nats(free_port(), "--auth", "tok-123")
    n.start()
    try:
        token = tmp_path / "token"
        token.write_text("tok-123\n")
        a = tern_factory("--bridge", f"nats://127.0.0.1:{n.port}/?token_file={token}")
        bad = tern_factory("--bridge", f"nats://nope@127.0.0.1:{n.port}")
        wait_for(lambda: bridge(a)["connected"], "the token connects")
        wait_for(lambda: bridge(bad)["auth_refused"], "a wrong token is refused")
        bad.stop()
    finally:
        n.stop()
    assert "refused the token" in bad.stderr and "nope" not in bad.stderr, bad.stderr


def test_a_cluster_list_connects_to_a_server_that_is_up(nats, tern_factory):
    down = free_port()
    a = tern_factory("--bridge", f"nats://127.0.0.1:{down},nats://127.0.0.1:{nats.port}",
                     "--log-level", "info")
    wait_for(lambda: bridge(a)["connected"], "connected to the second server")
    a.stop()
    assert f"nats 127.0.0.1:{down},127.0.0.1:{nats.port} connected to " \
           f"nats://127.0.0.1:{nats.port}" in a.stderr, a.stderr


def test_bad_nats_url_is_refused():
    for bad in ("nats://", "nats://h:0", "nats://h:70000", "nats://h/x", "nats://h,",
                "nats://h?what=1", "nats://u:p@h?token_file=/t", "nats://u@h:1,v@g",
                "nats://" + "h" * 300):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--bridge", bad],
                           capture_output=True, text=True, timeout=10 * SLOW)
        assert r.returncode != 0, bad
        assert "--bridge" in r.stderr and "URL" in r.stderr, (bad, r.stderr)


def test_a_refused_url_is_shown_without_its_secret():
    for bad, shown in (("nats://tok-99@h:0", "nats://****@h:0"),
                       ("nats://me:pw-99@h:0,g", "nats://me:****@h:0,g")):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--bridge", bad],
                           capture_output=True, text=True, timeout=10 * SLOW)
        assert r.returncode != 0 and shown in r.stderr, (bad, r.stderr)
        assert "-99" not in r.stderr, r.stderr


def test_nats_over_tls_verifies_the_server(tern_factory, tmp_path):
    cert, key = make_cert(str(tmp_path), "nats", "localhost", "DNS:localhost,IP:127.0.0.1")
    n = Nats(free_port(), "--tls", "--tlscert", cert, "--tlskey", key)
    n.start()
    try:
        url = f"tls://127.0.0.1:{n.port}"
        a = tern_factory("--bridge", f"{url}?ca={cert}")
        b = tern_factory("--bridge", f"{url}?ca={cert}")
        unknown = tern_factory("--bridge", url)   # the system's CAs do not know it
        wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "TLS connects")
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa, \
                connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
            subscribe(wa, "s")
            subscribe(wb, "s")
            wait_for(lambda: n.subjects() == ["tern.s"] * 2, "both nodes subscribed")
            a.publish("s", "sealed")
            assert recv_data(wa) == "sealed" and recv_data(wb) == "sealed"
        wait_for(lambda: "SSL handshake error" in unknown._err.text(),
                 "the unverified certificate said")
        assert "self-signed certificate" in unknown._err.text()
        assert bridge(unknown)["connected"] is False
        assert readyz(unknown)[0] == 503
    finally:
        n.stop()


def test_a_node_moves_to_another_server_of_the_cluster(cluster, tern_factory):
    url = ",".join(f"nats://127.0.0.1:{s.port}" for s in cluster)
    a = tern_factory("--bridge", url)
    b = tern_factory("--bridge", url)
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both nodes connected")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa, \
            connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
        subscribe(wa, "c")
        subscribe(wb, "c")
        sent = []

        def publish():
            sent.append(f"m{len(sent)}")
            a.publish("c", sent[-1])

        got_b = []

        def heard_by_b():
            """One publish; True once b's subscriber got it (what came
            before it kept in got_b)."""
            publish()
            try:
                while not got_b or got_b[-1] != sent[-1]:
                    got_b.append(recv_data(wb, timeout=0.3))
                return True
            except TimeoutError:
                return False
        # b's subscription may reach a's server through the routes a
        # moment after it lands on b's
        wait_for(heard_by_b, "b hears a through the cluster")
        for _ in range(20):
            publish()
        # a's server goes, with a's messages flowing
        name = f"tern-{a.proc.pid}"
        home = next(s for s in cluster if name in s.clients())
        home.stop()
        for _ in range(20):
            publish()
        wait_for(lambda: bridge(a)["connected"] and bridge(a)["reconnects"] >= 1,
                 "a on another server", timeout=15)
        assert any(name in s.clients() for s in cluster if s is not home)
        wait_for(heard_by_b, "b hears a again")
        # a's own subscriber got every one, in order (local delivery)
        assert [recv_data(wa) for _ in sent] == sent
        # b's: those that went through NATS, in order, never twice
        assert got_b == sorted(set(got_b), key=lambda m: int(m[1:])) and got_b[-1] == sent[-1]
    a.stop()
    assert "lost" in a.stderr and "connected again" in a.stderr, a.stderr


def test_credentials_changed_on_the_server_are_said(tern_factory):
    """A server restarted with another password: libnats gives the
    connection up after its refused reconnects, and the bridge starts again
    from scratch, said as refused and not ready, until it is let in."""
    port = free_port()
    n = Nats(port, "--user", "tern", "--pass", "old")
    n.start()
    try:
        a = tern_factory("--bridge", f"nats://tern:old@127.0.0.1:{port}")
        wait_for(lambda: bridge(a)["connected"], "connected")
        n.stop()
        n = Nats(port, "--user", "tern", "--pass", "new")
        n.start()
        wait_for(lambda: bridge(a)["auth_refused"], "the old password refused", timeout=20)
        assert readyz(a) == (503, "not ready: bridge (nats) auth failed\n")
        n.stop()
        n = Nats(port, "--user", "tern", "--pass", "old")
        n.start()
        wait_for(lambda: bridge(a)["connected"], "let in again", timeout=20)
        assert readyz(a) == (200, "ready\n")
    finally:
        n.stop()
    a.stop()
    assert "refused the user and password" in a.stderr and "old" not in a.stderr, a.stderr
