"""Pub/sub across nodes through a real nats-server (`tern serve --bridge
nats://...`: the NATS engine, src/pubsub/nats.c): what NATS alone has.
What every engine guarantees (delivery across nodes exactly once and in
order, the server lost and back, resume on another node...) is in
test_bridge_engines.py, run against Redis and NATS.

Checked: NATS over TLS (tls://) connects to a server whose certificate
verifies against ?ca= and is refused, with OpenSSL's reason, without it;
wrong credentials are logged with NATS's reason, /readyz 503, and the
right ones (in the URL or a file) connect; a cluster's URL list connects
to a server that is up, and a node whose server is killed in a
three-server cluster (routes on 127.0.0.1) moves to another and goes on
delivering, in order and never twice; a bad URL stops tern serve with a
clear message.

Topics with a history are numbered by JetStream (every nats-server here
runs with -js and a storage directory of its own): a server restarted
with its storage keeps the streams and their epochs, a stream made anew
(storage lost) has a new epoch, the stream keeps the rule's history size,
a server without JetStream leaves the numbering to each node, and in a
three-server cluster with replicas=3 a server killed during a publish
stream loses nothing (also when the servers left stall for longer than
a publish was once tried) and a client moved to another node resumes.

Credentials files (?creds=): a nats-server in operator mode (an operator's
JWTs, made by nats_jwt.py as nsc makes them) lets in nodes whose user it
trusts, which publish to each other, numbered by the account's JetStream
and live, and refuses, said once with NATS's reason, a user of an account
it does not know and one whose seed is not the JWT's; a file that cannot
be read is said as this node's failure."""
import re
import shutil
import signal
import subprocess
import time

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN, wait_for
from engines import (Nats, free_port, http_publish, numbered_nodes, pubsub_subscribe, readyz,
                     recv_data, recv_msg, subscribe)
from engines import bridge as any_bridge
from nats_jwt import NKey, Operator
from test_tls import make_cert

pytestmark = pytest.mark.skipif(shutil.which("nats-server") is None,
                                reason="nats-server missing (scripts/install-deps.sh test)")


@pytest.fixture
def nats():
    n = Nats(free_port())
    n.start()
    yield n
    n.stop()


@pytest.fixture
def numbered(nats, tern_factory):
    return numbered_nodes(tern_factory, nats.url)


def bridge(node):
    """/stats' "bridge" object: NATS's counters, named; "redis" is Redis's alone."""
    assert node.stats()["redis"] is None
    st = any_bridge(node)
    assert st["engine"] == "nats", st
    return st


def heard_live(n, a, b, data):
    """A subscriber of topic s on each of nodes a and b (linked through
    nats-server n); True once a's publish of data reached both."""
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa, \
            connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
        subscribe(wa, "s")
        subscribe(wb, "s")
        wait_for(lambda: n.subscriptions() == ["tern.s"] * 2, "both nodes subscribed")
        a.publish("s", data)
        return recv_data(wa) == data and recv_data(wb) == data


@pytest.fixture
def cluster():
    """Three nats-servers routed to each other on 127.0.0.1."""
    routes = [free_port() for _ in range(3)]
    servers = [Nats(free_port(), "--server_name", f"n{i}", "--cluster_name", "tern", "--cluster",
                    f"nats://127.0.0.1:{routes[i]}", "--routes",
                    ",".join(f"nats://127.0.0.1:{r}" for j, r in enumerate(routes) if j != i))
               for i in range(3)]
    for s in servers:
        s.start()
    wait_for(lambda: all(s.get("/routez")["num_routes"] == 2 for s in servers), "routes up")
    yield servers
    for s in servers:
        s.stop()


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
        assert heard_live(n, a, b, "sealed")
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


# ---- numbering by JetStream: topics with a history resume on any node ----

def test_a_restarted_server_keeps_the_streams_and_their_epochs(nats, numbered):
    """nats-server restarted with its storage (both nodes lose it): the
    streams and their epochs are kept, so what is numbered after the
    restart follows what came before, and a subscriber of before resumes.
    (A node that alone loses its link and reads back what it missed:
    test_bridge_engines, for every engine.)"""
    a, b = numbered
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t")
        for i in range(2, 12):
            http_publish(a, "t", "m%d" % i)
        assert [recv_msg(ws)["seq"] for _ in range(10)] == list(range(2, 12))
    nats.stop()
    wait_for(lambda: not bridge(a)["connected"] and not bridge(b)["connected"], "both lost")
    nats.start()
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both back")
    for i in range(12, 22):
        http_publish(a, "t", "m%d" % i)
    wait_for(lambda: nats.streams()["tern_t"][1] == 21, "numbered after the restart")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:   # the same epoch: the stream kept
        missed, again = pubsub_subscribe(ws, "t", epoch=ack["epoch"], after="1")
        assert again["resumed"] is True and again["epoch"] == ack["epoch"], again
        # What b had heard when the resume came is replayed; the rest (the
        # stream counts it, b may not have heard it yet) comes live after.
        seqs = [m["seq"] for m in missed]
        while not seqs or seqs[-1] < 21:
            seqs.append(recv_msg(ws)["seq"])
        assert seqs == list(range(2, 22))


def test_a_stream_made_anew_has_a_new_epoch(nats, numbered):
    """The broker's storage lost: the topic's stream is made again under
    a new epoch, so a subscriber of the old one is told it cannot resume
    (not handed seqs of another numbering as if they followed its own)."""
    a, b = numbered
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, old = pubsub_subscribe(ws, "t")
    nats.stop()
    nats.wipe()
    nats.start()
    wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "both back")
    http_publish(b, "t", "new")
    wait_for(lambda: nats.streams().get("tern_t", (None, 0))[1] == 1, "a new stream")
    desc = nats.streams()["tern_t"][0]
    assert desc != "tern epoch " + old["epoch"]

    def epoch_on(node):
        with connect(f"ws://127.0.0.1:{node.port}/pubsub") as ws:
            return pubsub_subscribe(ws, "t")[1]["epoch"]
    wait_for(lambda: "tern epoch " + epoch_on(a) == desc == "tern epoch " + epoch_on(b),
             "both nodes on the new epoch")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t", epoch=old["epoch"], after="1")
        assert ack["resumed"] is False, ack


def test_a_stream_keeps_the_history_size(nats, numbered):
    """The stream keeps what the rule's history keeps: --pubsub-history
    1000 is max_msgs 1000; its name escapes what JetStream refuses."""
    a, b = numbered
    http_publish(a, "x.y~z", "m")
    wait_for(lambda: "tern_x_2Ey_7Ez" in nats.streams(), "the stream")
    st = nats.get("/jsz?streams=1&config=1")
    cfg = {s["name"]: s["config"] for acc in st["account_details"]
           for s in acc["stream_detail"]}["tern_x_2Ey_7Ez"]
    assert cfg["max_msgs"] == 1000 and cfg["subjects"] == ["ternjs.x%2Ey~z"], cfg


def test_without_jetstream_each_node_numbers_its_topics(tern_factory):
    """A nats-server without JetStream: topics with a history still go to
    every node (each numbering them itself), and the log says why a
    subscriber cannot resume on another node."""
    n = Nats(free_port(), js=False)
    n.start()
    try:
        url = f"nats://127.0.0.1:{n.port}"
        a = tern_factory("--bridge", url, "--feed", "off", "--pubsub-history", "100")
        b = tern_factory("--bridge", url, "--feed", "off", "--pubsub-history", "100")
        wait_for(lambda: bridge(a)["connected"] and bridge(b)["connected"], "connected")
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa, \
                connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
            pubsub_subscribe(wa, "t")
            pubsub_subscribe(wb, "t")
            for i in range(1, 6):
                http_publish(a, "t", "m%d" % i)
            assert [(m["seq"], m["data"]) for m in (recv_msg(wa) for _ in range(5))] == \
                [(i, "m%d" % i) for i in range(1, 6)]
            assert [(m["seq"], m["data"]) for m in (recv_msg(wb) for _ in range(5))] == \
                [(i, "m%d" % i) for i in range(1, 6)]
    finally:
        n.stop()
    a.stop()
    assert "has no JetStream: topics with a history are numbered by each node" in a.stderr, \
        a.stderr


def recv_until_quiet(ws, n, quiet=40):
    """Up to n messages, fewer when none comes for quiet seconds."""
    got = []
    try:
        while len(got) < n:
            got.append(recv_msg(ws, timeout=quiet))
    except TimeoutError:
        pass
    return got


def what_missed(who, got, sent, counters):
    """What node who's subscriber missed (or got wrong) of sent, and the
    nodes' bridge counters (a publish JetStream never stored is dropped)."""
    seqs = [m["seq"] for m in got]
    lost = [(i + 1, m) for i, m in enumerate(sent) if i + 1 not in seqs]
    return f"{who}'s subscriber missed {lost}, got seqs {seqs}; bridges: {counters}"


@pytest.mark.parametrize("stall", [0, 12], ids=["failover", "stalled-failover"])
def test_a_client_moved_to_another_node_resumes_when_a_server_dies(cluster, tern_factory, stall):
    """Streams kept on three servers (replicas=3): one is killed during a
    stream of publishes (the one node a is linked to, perhaps the
    stream's leader: publishes are tried again, under the same message id,
    until another leads). Every subscriber of both nodes gets every
    message once, in order and numbered without a gap (a reads back what
    went by while it moved), and a client moved from a to b resumes with
    no gap and no duplicate. stalled-failover: the two servers left get
    no CPU for 12 s meanwhile (stopped, as on a loaded machine), so the
    new leaders come later than the 10 s a publish was once tried for."""
    wait_for(lambda: all(s.get("/jsz").get("meta_cluster", {}).get("leader") for s in cluster),
             "JetStream's cluster has a leader")
    every = ",".join(f"nats://127.0.0.1:{s.port}" for s in cluster)
    history = ("--feed", "off", "--pubsub-history", "1000")
    a = tern_factory("--bridge", every + "?replicas=3", *history)
    wait_for(lambda: bridge(a)["connected"], "a connected")
    name = f"tern-{a.proc.pid}"
    home = next(s for s in cluster if name in s.clients())
    # b on the other two: its publishes go on while a's server dies
    others = ",".join(f"nats://127.0.0.1:{s.port}" for s in cluster if s is not home)
    b = tern_factory("--bridge", others + "?replicas=3", *history)
    wait_for(lambda: bridge(b)["connected"], "b connected")
    sent = ["m%d" % i for i in range(60)]
    # no keepalive pings: each connection waits unread while another is
    # read (moving while wa and wb are, wb while wa is, through a
    # failover), and the client stops reading one whose queue is full, so
    # a pong would go unheard and the client close it (1011)
    quiet = dict(ping_interval=None)
    with connect(f"ws://127.0.0.1:{a.port}/pubsub", **quiet) as wa, \
            connect(f"ws://127.0.0.1:{b.port}/pubsub", **quiet) as wb, \
            connect(f"ws://127.0.0.1:{a.port}/pubsub", **quiet) as moving:
        pubsub_subscribe(moving, "c")
        pubsub_subscribe(wa, "c")
        pubsub_subscribe(wb, "c")
        http_publish(b, "c", sent[0])
        # the stream made on three servers, its leader elected: seconds
        # under load (the engine tries for up to 60 s)
        first = recv_msg(moving, timeout=40)
        assert (first["seq"], first["data"]) == (1, sent[0]), first
        for m in sent[1:20]:
            http_publish(b, "c", m)
        got_moving = [first] + [recv_msg(moving, timeout=10) for _ in range(19)]
        home.stop()
        rest = [s for s in cluster if s is not home]
        for s in rest if stall else ():
            s.proc.send_signal(signal.SIGSTOP)
        for m in sent[20:]:
            http_publish(b, "c", m)
        if stall:
            time.sleep(stall)   # the stall's length: no condition to wait for
            for s in rest:
                s.proc.send_signal(signal.SIGCONT)
        for who, ws in (("a", wa), ("b", wb)):
            got = recv_until_quiet(ws, len(sent))
            assert [(m["seq"], m["data"]) for m in got] == \
                [(i + 1, m) for i, m in enumerate(sent)], \
                what_missed(who, got, sent, {"a": bridge(a), "b": bridge(b)})
            with pytest.raises(TimeoutError):   # nothing twice
                ws.recv(timeout=0.3)
    assert [m["seq"] for m in got_moving] == list(range(1, 21))
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:   # the stream's epoch
        epoch = pubsub_subscribe(ws, "c")[1]["epoch"]
    wait_for(lambda: bridge(a)["reconnects"] >= 1 and bridge(a)["connected"],
             "a on another server")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        missed, again = pubsub_subscribe(ws, "c", epoch=epoch, after="20")
        assert again["resumed"] is True and again["epoch"] == epoch, again
        assert [(m["seq"], m["data"]) for m in missed] == \
            [(i + 1, m) for i, m in enumerate(sent) if i >= 20]
        http_publish(a, "c", "last")
        got = recv_until_quiet(ws, 1, quiet=20)
        assert [(m["seq"], m["data"]) for m in got] == [(61, "last")], \
            (got, bridge(a), a._err.text())
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.3)
    # (a drops what it makes while it moves: its stats)
    assert bridge(b)["dropped"] == 0, (bridge(b), b._err.text())


@pytest.fixture
def operator_nats(tmp_path):
    """A nats-server in operator mode (JetStream on): it lets in only the
    users of the accounts its operator signed; (the operator, the server)."""
    op = Operator()
    conf = tmp_path / "operator.conf"
    conf.write_text(op.config())
    n = Nats(free_port(), "-c", str(conf))
    n.start()
    yield op, n
    n.stop()


def test_a_credentials_file_nats_trusts_connects(operator_nats, tern_factory, tmp_path):
    """?creds= names a NATS credentials file (a user JWT and its seed):
    nodes with a user of the operator's account are let in, ready, and
    publish to each other, numbered by the account's JetStream and live;
    a node without the file is refused (the server asks for credentials)."""
    op, n = operator_nats
    creds = tmp_path / "user.creds"
    creds.write_text(op.user_creds())
    url = f"nats://127.0.0.1:{n.port}?creds={creds}"
    bare = tern_factory("--bridge", f"nats://127.0.0.1:{n.port}")
    a, b = numbered_nodes(tern_factory, url)
    assert readyz(a) == (200, "ready\n") and readyz(b) == (200, "ready\n")
    # numbered by the account's JetStream: both nodes under the epoch of
    # t's stream (without JetStream, each would number t under its own)
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        epoch = pubsub_subscribe(ws, "t")[1]["epoch"]
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t")
        assert ack["epoch"] == epoch, (ack, epoch)
        http_publish(a, "t", "numbered")
        m = recv_msg(ws)
        assert (m["seq"], m["data"]) == (2, "numbered"), m
    c = tern_factory("--bridge", url)   # topics without a history: core NATS alone
    d = tern_factory("--bridge", url)
    wait_for(lambda: bridge(c)["connected"] and bridge(d)["connected"], "both nodes connected")
    assert heard_live(n, c, d, "live")
    wait_for(lambda: bridge(bare)["auth_refused"], "the node without credentials refused")
    assert bridge(bare)["connected"] is False
    assert readyz(bare) == (503, "not ready: bridge (nats) auth failed\n")
    a.stop()
    b.stop()
    assert "has no JetStream" not in a.stderr + b.stderr, (a.stderr, b.stderr)


@pytest.mark.parametrize("wrong", ["unknown-account", "wrong-seed"])
def test_a_credentials_file_nats_refuses_is_said(operator_nats, tern_factory, tmp_path, wrong):
    """A user JWT signed by an account the server does not know, or a seed
    that is not the JWT's user's (the server's nonce signed by another
    key): refused, said once as an error with NATS's reason, never the
    seed, and /readyz 503."""
    op, n = operator_nats
    other = NKey("account" if wrong == "unknown-account" else "user")
    text = op.user_creds(account=other) if wrong == "unknown-account" \
        else op.user_creds(seed_of=other)
    creds = tmp_path / "user.creds"
    creds.write_text(text)
    seed = text.split("-----BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    bad = tern_factory("--bridge", f"nats://127.0.0.1:{n.port}?creds={creds}")
    wait_for(lambda: bridge(bad)["auth_refused"], "the credentials refused")
    assert readyz(bad) == (503, "not ready: bridge (nats) auth failed\n")
    assert bridge(bad)["connected"] is False
    bad.stop()
    line = [x for x in bad.stderr.splitlines() if "refused" in x]
    assert len(line) == 1, bad.stderr   # said once, however many tries
    assert "[error]" in line[0] and "refused the credentials file" in line[0], line
    assert "uthorization" in line[0], line   # NATS's own words
    assert seed not in bad.stderr


def test_a_credentials_file_that_cannot_be_read_is_said(nats, tern_factory, tmp_path):
    """A credentials file that cannot be read is said as this node's
    failure, with the file's name and the reason (not as the server's
    refusal), and /readyz says the bridge is down."""
    missing = tmp_path / "user.creds"
    a = tern_factory("--bridge", f"nats://127.0.0.1:{nats.port}?creds={missing}")
    wait_for(lambda: bridge(a)["connected"] is False and readyz(a)[0] == 503, "not ready")
    assert readyz(a) == (503, "not ready: bridge (nats) down\n")
    assert bridge(a)["connected"] is False
    a.lines().wait(re.escape(f"cannot connect: cannot read {missing}: No such file"))
    a.stop()
    said = [x for x in a.stderr.splitlines() if "cannot read" in x]
    assert len(said) == 1 and "[error]" in said[0], a.stderr   # once, as an error
