"""The pub/sub engines' servers for the tests that bridge tern nodes
(--bridge): redis-server and nats-server (with JetStream), each on
127.0.0.1 and a free port, and what those tests share: the /pubsub client
steps, publishing over HTTP, a node's bridge counters, /readyz, /metrics,
two nodes whose topics are numbered by the engine, and a link to the
engine that can be held back or cut.

Redis and Nats answer the same questions (url, subscriptions, channel,
claimed_epoch, last_seq) in their own terms, so that test_bridge_engines
runs one test against either; what only one engine has stays in
test_redis.py / test_nats.py."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref

from websockets.sync.client import connect

from conftest import SLOW, wait_for

HANDED_OUT = set()


def free_port():
    """A free port on 127.0.0.1 no other call has handed out: the servers
    of a NATS cluster are all made (their ports chosen) before any listens,
    and the kernel may offer a port again until something binds it."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in HANDED_OUT:
            HANDED_OUT.add(p)
            return p



# The channel and subject of presence across nodes (src/app/presence_nodes.h),
# which every node with a bridge subscribes from its start: left out of the
# topics' subscriptions the tests count.
PRESENCE_REDIS = "tern:\x01\x01presence"
PRESENCE_NATS = "tern.%01%01presence"

class Redis:
    """A redis-server on 127.0.0.1 that keeps nothing on disk."""
    name = "redis"
    binary = "redis-server"

    def __init__(self, port):
        self.port = port
        self.proc = None

    @property
    def url(self):
        return self.url_at(self.port)

    def url_at(self, port):
        """Its URL as a node behind a proxy on port gives it."""
        return f"redis://127.0.0.1:{port}"

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

    def channel(self, topic):
        """The channel a topic's live messages go by."""
        return "tern:" + topic

    def subscriptions(self):
        """Every node's subscriptions to topics' channels, one entry per
        node whose subscription has landed (PUBSUB NUMSUB; PUBSUB CHANNELS
        lists a channel from its first subscriber on)."""
        names = [c for c in self.command("PUBSUB", "CHANNELS", "tern:*") if c != PRESENCE_REDIS]
        counts = self.command("PUBSUB", "NUMSUB", *names)[1::2] if names else []
        return sorted(c for c, n in zip(names, counts) for _ in range(n))

    def claimed_epoch(self, topic):
        """The epoch Redis numbers the topic under (None before a claim)."""
        return self.command("HGET", "tern:n:" + topic, "e")

    def last_seq(self, topic):
        """The last seq Redis gave the topic."""
        return int(self.command("HGET", "tern:n:" + topic, "s") or 0)


class Nats:
    """A nats-server on 127.0.0.1 (port, and a monitoring port for its
    subscriptions) with JetStream, its storage in a directory of its own
    (kept across a restart); auth: extra arguments (--user/--pass, --auth,
    or a cluster's); js=False: without JetStream."""
    name = "nats"
    binary = "nats-server"

    def __init__(self, port, *auth, js=True):
        self.port = port
        self.monitor = free_port()
        self.auth = list(auth)   # or a cluster's arguments
        self.store = tempfile.mkdtemp(prefix="tern-nats-") if js else None
        if self.store:
            weakref.finalize(self, shutil.rmtree, self.store, True)
        self.proc = None

    @property
    def url(self):
        return self.url_at(self.port)

    def url_at(self, port):
        """Its URL as a node behind a proxy on port gives it."""
        return f"nats://127.0.0.1:{port}"

    def start(self):
        js = ["-js", "-sd", self.store] if self.store else []
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor),
             *js, *self.auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

    def wipe(self):
        """Its JetStream storage gone (stopped first): every stream lost."""
        shutil.rmtree(self.store, ignore_errors=True)
        os.makedirs(self.store)

    def channel(self, topic):
        """The subject a topic's live messages go by: '.' escaped, so that
        NATS sees one token (enough for the topics the tests use)."""
        return "tern." + topic.replace(".", "%2E")

    def subscriptions(self):
        """Every client's subscriptions to topics ("tern." subjects), one
        entry per subscription."""
        conns = self.get("/connz?subs=1")["connections"] or []
        return sorted(s for c in conns for s in c.get("subscriptions_list", [])
                      if s.startswith("tern.") and s != PRESENCE_NATS)

    def streams(self):
        """JetStream's streams: name to (description, last seq)."""
        st = self.get("/jsz?streams=1&config=1")
        return {s["name"]: (s["config"].get("description"), s["state"]["last_seq"])
                for a in st.get("account_details") or [] for s in a.get("stream_detail") or []}

    def claimed_epoch(self, topic):
        """The epoch the topic's stream is numbered under (its description;
        None before a claim). Plain topic names only (no escaping)."""
        desc = self.streams().get("tern_" + topic, (None,))[0]
        return desc[len("tern epoch "):] if desc and desc.startswith("tern epoch ") else None

    def last_seq(self, topic):
        """The topic stream's last sequence."""
        return self.streams().get("tern_" + topic, (None, 0))[1]

    def clients(self):
        """The names of the clients connected (tern's: tern-PID)."""
        return [c.get("name", "") for c in self.get("/connz")["connections"] or []]


def subscribe(ws, topic):
    ws.send(json.dumps({"op": "subscribe", "topic": topic}))
    ack = json.loads(ws.recv(timeout=5 * SLOW))
    assert ack["ok"] == "subscribe" and ack["topic"] == topic, ack


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
    """The next message, skipping acks."""
    while True:
        m = json.loads(ws.recv(timeout=timeout * SLOW))
        if "data" in m:
            return m


def recv_data(ws, timeout=5.0):
    """The next message's data, skipping acks."""
    return recv_msg(ws, timeout)["data"]


def http_publish(node, topic, body):
    """POST /publish; its JSON answer."""
    return node.publish(topic, body)


def bridge(node):
    """/stats' "bridge" object: the engine's counters, named."""
    return node.stats()["bridge"]


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


def history(node, topic):
    """POST /history on the node's admin listener (its server API): the
    first page of topic's history there, {"epoch", "first", "last",
    "messages", ...}."""
    req = urllib.request.Request(f"{node.admin_base}/history", method="POST",
                                 data=json.dumps({"topic": topic}).encode(),
                                 headers={"Authorization": f"Bearer {node.api_key}"})
    with urllib.request.urlopen(req, timeout=5 * SLOW) as r:
        return json.loads(r.read())


def numbered_nodes(tern_factory, url, url_b=None):
    """Two nodes (one loop, two loops) whose topics have a history,
    numbered by the engine at url (b's: url_b, a proxy's, if given), both
    having heard topic t once (its epoch) before the test goes on."""
    def make(url, *extra):
        return tern_factory("--bridge", url, "--feed", "off", "--pubsub-history", "1000",
                            *extra)
    a, b = make(url), make(url_b or url, "--threads", "2")
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both nodes connected")

    def heard(node):
        with connect(f"ws://127.0.0.1:{node.port}/pubsub") as ws:
            return pubsub_subscribe(ws, "t")[1]["seq"] >= 1
    # the publishing node hears its own message back from the engine too
    assert http_publish(a, "t", "m1")["seq"] == 0   # numbered later, by the engine
    wait_for(lambda: heard(a) and heard(b), "both nodes heard t")
    return a, b


class HeldLink:
    """A TCP proxy to an engine on 127.0.0.1:port for the nodes linked
    through it: its replies (engine to node) can be held back (flowing
    cleared), so a node behind it stays behind the others; or the links
    cut (cut(): closed, and new ones closed at once until mend())."""

    def __init__(self, port):
        self.flowing = threading.Event()
        self.flowing.set()
        self.open = threading.Event()
        self.open.set()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.port = self.srv.getsockname()[1]
        self.engine_port = port
        self.links = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.srv.accept()
            except OSError:
                return
            if not self.open.is_set():
                down.close()
                continue
            up = socket.create_connection(("127.0.0.1", self.engine_port))
            self.links += [down, up]
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

    def cut(self):
        """Every link through it ends (the node sees its engine gone), and
        the node's tries to link again fail until mend()."""
        self.open.clear()
        for s in self.links:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def mend(self):
        self.open.set()

    def close(self):
        self.flowing.set()
        self.srv.close()
        for s in self.links:
            s.close()
