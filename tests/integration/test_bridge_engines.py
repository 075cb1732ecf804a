"""What nodes bridged through an engine (--bridge) guarantee whichever the
engine is: each test runs against a real redis-server (ids ...[redis]) and
a real nats-server with JetStream (...[nats]), started on 127.0.0.1 and a
free port (engines.py).

Checked: two nodes (one with one loop, one with two) deliver every publish
(WebSocket /pubsub and POST /publish) to every subscriber of both nodes
exactly once, each node's publishes in the order it made them, on a topic
with a '.' in its name; a node subscribes a topic's channel only while it
has subscribers to it; the engine killed mid-stream leaves local delivery
going, /readyz 503, /metrics and the log saying so, and restarted on the
same port brings cross-node delivery back; a node started before its
engine serves locally, then joins; every node's "stats" reach every node,
each naming its node. Topics with a history are numbered by the engine: a
subscriber resumes on another node with no gap and no duplicate (also one
that came before the topic's first message: its node's claimed epoch,
which a second node adopts), a client ahead of its new node gets nothing
twice, a node whose link was cut reads back what went by meanwhile, and a
node started after a topic's messages were numbered reads back what the
engine keeps of them once it learns the topic (a subscriber's claim, or a
message heard), so that a client resumes there too, or is told its
resume is too old when the engine no longer keeps it.

What only one engine has (Redis's AUTH, scripts, DNS; NATS's cluster, TLS,
credentials, streams) is in test_redis.py, test_redis_auth.py and
test_nats.py."""
import json
import shutil
import time

import pytest
from websockets.sync.client import connect

from conftest import SLOW, wait_for
from engines import (HeldLink, Nats, Redis, bridge, free_port, history, http_publish, metrics,
                     numbered_nodes, pubsub_subscribe, readyz, recv_data, recv_msg, subscribe)


@pytest.fixture(params=[Redis, Nats], ids=["redis", "nats"])
def engine_kind(request):
    """The engine's class; its server missing, the test is skipped."""
    if shutil.which(request.param.binary) is None:
        pytest.skip(f"{request.param.binary} missing (scripts/install-deps.sh test)")
    return request.param


@pytest.fixture
def engine(engine_kind):
    """The engine's server, up."""
    e = engine_kind(free_port())
    e.start()
    yield e
    e.stop()


@pytest.fixture
def numbered(engine, tern_factory):
    return numbered_nodes(tern_factory, engine.url)


def connected(*nodes):
    return all(bridge(n)["connected"] for n in nodes)


def test_two_nodes_deliver_exactly_once_in_order(engine, tern_factory):
    a = tern_factory("--bridge", engine.url)
    b = tern_factory("--bridge", engine.url, "--threads", "2")
    wait_for(lambda: connected(a, b), "both nodes connected")
    assert bridge(a)["engine"] == engine.name
    # what the nodes' feed published before they connected is dropped
    # (counted); from here on nothing is
    dropped = bridge(a)["dropped"]
    assert engine.subscriptions() == []   # nobody subscribes to anything yet
    subs = [connect(f"ws://127.0.0.1:{n.port}/pubsub") for n in (a, a, b, b, b)]
    try:
        for ws in subs:
            subscribe(ws, "p.x")
        # one subscription per node (NATS: the '.' escaped, one token, not two)
        wait_for(lambda: engine.subscriptions() == [engine.channel("p.x")] * 2,
                 "both nodes subscribed")
        pub_b = connect(f"ws://127.0.0.1:{b.port}/pubsub")
        sent = []
        for i in range(100):
            if i % 3 == 0:
                http_publish(a, "p.x", f"a{i}")
                sent.append(f"a{i}")
            elif i % 3 == 1:
                http_publish(b, "p.x", f"b{i}")
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
    # the last subscriber gone, the nodes leave the channel
    wait_for(lambda: engine.subscriptions() == [], "p.x unsubscribed in the engine")


def test_lost_and_back(engine, tern_factory):
    a = tern_factory("--bridge", engine.url)
    b = tern_factory("--bridge", engine.url)
    wait_for(lambda: connected(a, b), "both nodes connected")
    assert readyz(a) == (200, "ready\n")
    wa = connect(f"ws://127.0.0.1:{a.port}/pubsub")
    wb = connect(f"ws://127.0.0.1:{b.port}/pubsub")
    try:
        subscribe(wa, "t")
        subscribe(wb, "t")
        wait_for(lambda: engine.subscriptions() == [engine.channel("t")] * 2,
                 "both nodes subscribed")
        http_publish(a, "t", "before")
        assert recv_data(wa) == "before" and recv_data(wb) == "before"

        engine.stop()
        wait_for(lambda: not bridge(a)["connected"], "a sees its engine gone")
        assert readyz(a) == (503, f"not ready: bridge ({engine.name}) down\n")
        text = metrics(a)
        assert f'tern_bridge_up{{engine="{engine.name}"}} 0\n' in text
        assert f'tern_bridge_configured{{engine="{engine.name}"}} 1\n' in text
        # the deprecated tern_redis_* speak of Redis alone
        if engine.name == "redis":
            assert "\ntern_redis_up 0\n" in text
        else:
            assert "\ntern_redis_configured 0\n" in text and "tern_redis_up" not in text
        # local delivery goes on; the other node misses it (counted)
        http_publish(a, "t", "alone")
        assert recv_data(wa) == "alone"
        with pytest.raises(TimeoutError):
            wb.recv(timeout=0.5)
        assert bridge(a)["dropped"] >= 1

        engine.start()   # the same port
        wait_for(lambda: connected(a, b), "both nodes back", timeout=15)
        wait_for(lambda: engine.subscriptions() == [engine.channel("t")] * 2,
                 "subscribed again")
        assert readyz(a) == (200, "ready\n")
        assert f'tern_bridge_up{{engine="{engine.name}"}} 1\n' in metrics(a)
        http_publish(a, "t", "after")
        assert recv_data(wa) == "after" and recv_data(wb) == "after"
        assert bridge(a)["reconnects"] >= 1
    finally:
        wa.close()
        wb.close()
    a.stop()
    assert f"{engine.name} 127.0.0.1:{engine.port} lost" in a.stderr
    assert f"{engine.name} 127.0.0.1:{engine.port} connected again" in a.stderr


def test_not_there_yet(engine_kind, tern_factory):
    """A node started before its engine serves locally, then joins; the
    engine's absence is logged once, however many tries."""
    port = free_port()
    a = tern_factory("--bridge", engine_kind(port).url)
    assert bridge(a)["connected"] is False
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        subscribe(ws, "early")
        http_publish(a, "early", "local")
        assert recv_data(ws) == "local"
        e = engine_kind(port)
        e.start()
        try:
            wait_for(lambda: bridge(a)["connected"], "connected", timeout=15)
            wait_for(lambda: e.subscriptions() == [e.channel("early")],
                     "subscribed after connecting")
        finally:
            e.stop()
    a.stop()
    assert a.stderr.count(f"{e.name} 127.0.0.1:{port} unreachable") == 1, a.stderr


def test_stats_names_the_node_that_sent_it(engine, tern_factory):
    # Issue #37: through the bridge every node's "stats" reach every
    # subscriber; each message names its node (--node-name), so a reader
    # (the page) keeps its own node's figures instead of mixing them.
    a = tern_factory("--bridge", engine.url, "--node-name", "node-a")
    b = tern_factory("--bridge", engine.url, "--node-name", "node-b")
    wait_for(lambda: connected(a, b), "both nodes connected")
    assert a.stats()["node"] == "node-a" and b.stats()["node"] == "node-b"
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        subscribe(ws, "stats")
        seen = {}
        deadline = time.time() + 10 * SLOW
        while set(seen) != {"node-a", "node-b"} and time.time() < deadline:
            d = json.loads(recv_data(ws))
            assert d["node"] in ("node-a", "node-b"), d   # one name, a known one
            seen.setdefault(d["node"], []).append(d["uptime"])
        assert set(seen) == {"node-a", "node-b"}, seen


# ---- topics with a history, numbered by the engine: resume on any node ----

def test_resume_on_another_node(engine, numbered):
    """The engine numbers a topic with a history (and keeps its epoch), so
    a subscriber cut from one node resumes on the other with no gap and no
    duplicate."""
    a, b = numbered
    assert engine.last_seq("t") == 1
    watcher = connect(f"ws://127.0.0.1:{a.port}/pubsub")
    pubsub_subscribe(watcher, "t")

    def publish(i):
        """From both nodes in turn, each numbered before the next is sent
        (a publish is numbered by the engine, after the ack)."""
        http_publish(a if i % 2 else b, "t", "m%d" % i)
        assert recv_msg(watcher)["data"] == "m%d" % i
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "t")
        epoch = ack["epoch"]
        assert ack["seq"] == 1, ack
        assert engine.claimed_epoch("t") == epoch
        for i in range(2, 12):
            publish(i)
        got = [recv_msg(ws) for _ in range(10)]
        assert [m["seq"] for m in got] == list(range(2, 12))
        assert [m["data"] for m in got] == ["m%d" % i for i in range(2, 12)]
    for i in range(12, 32):   # while away
        publish(i)
    watcher.close()
    assert engine.last_seq("t") == 31
    wait_for(lambda: bridge(b)["received"] >= 31, "b heard them")
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


def test_a_node_whose_link_was_cut_reads_back_what_it_missed(engine, tern_factory):
    """Its link cut (a proxy in between closes it and refuses it for a
    while), a node misses live messages the engine numbers meanwhile;
    back, it reads them from the engine, so its subscribers (and its
    history) have no gap."""
    link = HeldLink(engine.port)
    try:
        a, b = numbered_nodes(tern_factory, engine.url, engine.url_at(link.port))
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
            _, ack = pubsub_subscribe(ws, "t")
            for i in range(2, 12):
                http_publish(a, "t", "m%d" % i)
            assert [recv_msg(ws)["seq"] for _ in range(10)] == list(range(2, 12))
            before = bridge(b)["reconnects"]
            link.cut()
            wait_for(lambda: not bridge(b)["connected"], "b lost its engine")
            for i in range(12, 32):
                assert http_publish(a, "t", "m%d" % i)["seq"] == 0   # numbered later
            wait_for(lambda: engine.last_seq("t") == 31, "the engine numbered them")
            link.mend()
            wait_for(lambda: bridge(b)["reconnects"] > before and bridge(b)["connected"],
                     "b linked again", timeout=15)
            http_publish(a, "t", "m32")
            got = [recv_msg(ws) for _ in range(21)]
            assert [m["seq"] for m in got] == list(range(12, 33))
            assert [m["data"] for m in got] == ["m%d" % i for i in range(12, 33)]
            assert bridge(b)["fills"] >= 1
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)
        # and its history is whole: a resume on b from the start
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
            missed, again = pubsub_subscribe(ws, "t", epoch=ack["epoch"], after="1")
            assert again["resumed"] is True and again["epoch"] == ack["epoch"], again
            assert [m["seq"] for m in missed] == list(range(2, 33))
    finally:
        link.close()


def test_a_client_ahead_of_its_new_node_gets_no_duplicate(engine, tern_factory):
    """A subscriber that had seq 30 from node a resumes on node b, which
    has heard only up to 10 (its link to the engine held back): b sends
    nothing now, says so with the client's position, and when it catches
    up sends none of 11..30 again, only what comes after."""
    link = HeldLink(engine.port)
    try:
        history = ("--feed", "off", "--pubsub-history", "1000")
        a = tern_factory("--bridge", engine.url, *history)
        b = tern_factory("--bridge", engine.url_at(link.port), *history, "--threads", "2")
        wait_for(lambda: connected(a, b), "both nodes connected")
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
            pubsub_subscribe(ws, "t")
            for i in range(1, 11):
                http_publish(a, "t", "m%d" % i)
            assert [recv_msg(ws)["seq"] for _ in range(10)] == list(range(1, 11))
            wait_for(lambda: bridge(b)["received"] >= 10, "b heard 1..10")
            link.flowing.clear()   # b hears nothing more for now
            for i in range(11, 31):
                http_publish(a, "t", "m%d" % i)
            assert [recv_msg(ws)["seq"] for _ in range(20)] == list(range(11, 31))
        with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
            _, ack = pubsub_subscribe(ws, "t")   # the engine's epoch, heard with the messages
            epoch = ack["epoch"]
            assert ack["seq"] == 30, ack
        assert bridge(b)["received"] == 10
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
            missed, ack = pubsub_subscribe(ws, "t", epoch=epoch, after="30")
            assert missed == [] and ack["epoch"] == epoch, ack
            assert ack["resumed"] is True and ack["replayed"] == 0 and ack["seq"] == 30, ack
            link.flowing.set()   # b catches up: 11..30 are not sent again
            wait_for(lambda: bridge(b)["received"] >= 30, "b heard 11..30")
            http_publish(a, "t", "m31")
            m = recv_msg(ws)
            assert (m["seq"], m["data"]) == (31, "m31"), m
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)
    finally:
        link.close()


def test_a_subscriber_from_before_the_first_message_resumes(engine, tern_factory):
    """A client that subscribed before the topic's first message holds its
    node's epoch, which the node claimed in the engine (so the messages
    came numbered under it); its resume on that node gets what it missed."""
    a = tern_factory("--bridge", engine.url, "--feed", "off", "--pubsub-history", "1000")
    wait_for(lambda: connected(a), "connected")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "fresh")
        assert ack["seq"] == 0, ack
        for i in range(1, 6):
            http_publish(a, "fresh", "m%d" % i)
        got = [recv_msg(ws) for _ in range(5)]
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]
    for i in range(6, 9):
        http_publish(a, "fresh", "m%d" % i)
    wait_for(lambda: engine.last_seq("fresh") == 8, "the engine numbered them")
    wait_for(lambda: bridge(a)["received"] >= 8, "a heard them")
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        missed, again = pubsub_subscribe(ws, "fresh", epoch=ack["epoch"], after="5")
        assert again["resumed"] is True and again["replayed"] == 3, again
        assert again["epoch"] == ack["epoch"] == engine.claimed_epoch("fresh")   # claimed
        assert [m["data"] for m in missed] == ["m6", "m7", "m8"]
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:   # saw nothing at all
        missed, again = pubsub_subscribe(ws, "fresh", epoch=ack["epoch"], after="0")
        assert again["resumed"] is True and [m["seq"] for m in missed] == list(range(1, 9))


def test_a_subscriber_from_before_the_first_message_resumes_on_another_node(engine, numbered):
    """The epoch a subscriber gets before a topic's first message is
    claimed in the engine by its node, so the topic is numbered under it
    and the subscriber may resume on any node (it used to be refused
    elsewhere)."""
    a, b = numbered
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as ws:
        _, ack = pubsub_subscribe(ws, "early")
        assert ack["seq"] == 0, ack
        wait_for(lambda: engine.claimed_epoch("early") == ack["epoch"],
                 "the epoch claimed in the engine")
        for i in range(1, 6):
            http_publish(a, "early", "m%d" % i)
        got = [recv_msg(ws) for _ in range(5)]
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]
    for i in range(6, 9):
        http_publish(a, "early", "m%d" % i)
    wait_for(lambda: bridge(b)["received"] >= 8 + 1, "b heard them")
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        missed, again = pubsub_subscribe(ws, "early", epoch=ack["epoch"], after="5")
        assert again["resumed"] is True and again["replayed"] == 3, again
        assert again["epoch"] == ack["epoch"], again
        assert [m["data"] for m in missed] == ["m6", "m7", "m8"]
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:   # saw nothing at all
        missed, again = pubsub_subscribe(ws, "early", epoch=ack["epoch"], after="0")
        assert again["resumed"] is True and [m["seq"] for m in missed] == list(range(1, 9))


def test_a_second_node_adopts_a_claimed_epoch(engine, numbered):
    """Two nodes' subscribers before the first message: the node that
    claims second adopts the first one's epoch (the engine's), so both
    nodes' later subscribers hold one epoch."""
    a, b = numbered
    with connect(f"ws://127.0.0.1:{a.port}/pubsub") as wa:
        _, ack_a = pubsub_subscribe(wa, "both")
        wait_for(lambda: engine.claimed_epoch("both") == ack_a["epoch"], "a's claim")
        with connect(f"ws://127.0.0.1:{b.port}/pubsub") as wb:
            pubsub_subscribe(wb, "both")

            def b_epoch():
                with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
                    return pubsub_subscribe(ws, "both")[1]["epoch"]
            wait_for(lambda: b_epoch() == ack_a["epoch"], "b adopted a's epoch")
            http_publish(b, "both", "x")
            assert recv_msg(wa)["seq"] == 1 and recv_msg(wb)["seq"] == 1


# ---- a node started after a topic's messages were numbered ----------------

def numbered_before(engine, tern_factory, topic, count, keep):
    """Node a (one loop) numbers topic's messages m1..m<count> through the
    engine, every node keeping `keep` of them; then node c (two loops)
    starts, having heard none. Returns (a, c, the engine's epoch)."""
    args = ("--bridge", engine.url, "--feed", "off", "--pubsub-history", str(keep))
    a = tern_factory(*args)
    wait_for(lambda: connected(a), "a connected")
    for i in range(1, count + 1):
        http_publish(a, topic, "m%d" % i)
    wait_for(lambda: engine.last_seq(topic) == count, "the engine numbered them")
    epoch = engine.claimed_epoch(topic)
    c = tern_factory(*args, "--threads", "2")
    wait_for(lambda: connected(c), "c connected")
    assert history(c, topic)["epoch"] is None   # nothing of the topic there yet
    return a, c, epoch


def seqs(page):
    """The seqs of a page of history (engines.history)."""
    return [m["seq"] for m in page["messages"]]


def learns(node, topic, epoch, last):
    """A subscriber on node makes it learn topic's numbering from the
    engine (its claim, answered with the engine's epoch and last seq):
    waits until a new subscriber there is given them."""
    def knows():
        with connect(f"ws://127.0.0.1:{node.port}/pubsub") as ws:
            ack = pubsub_subscribe(ws, topic)[1]
            return (ack["epoch"], ack["seq"]) == (epoch, last)
    wait_for(knows, "the node adopted the engine's epoch")


@pytest.mark.parametrize("how", ["subscriber", "live"])
def test_a_node_started_later_resumes_what_it_never_heard(engine, tern_factory, how):
    """A node started after a topic's messages were numbered never heard
    them; once it learns the topic's numbering from the engine (a
    subscriber's claim answered, or the topic's next message heard live) it
    reads back what the engine keeps into its history, so a client that
    comes to it from another node resumes there: exactly the messages
    after its seq, in order, no duplicate, then the live stream."""
    a, c, epoch = numbered_before(engine, tern_factory, "late", 5, 1000)
    last = 5
    if how == "subscriber":
        learns(c, "late", epoch, last)
    else:
        http_publish(a, "late", "m6")
        last = 6
        wait_for(lambda: history(c, "late")["last"] == 6, "c heard m6 live")
    wait_for(lambda: seqs(history(c, "late")) == list(range(1, last + 1)),
             "c read back what it never heard")
    assert history(c, "late")["epoch"] == epoch
    for after in (1, 0):
        with connect(f"ws://127.0.0.1:{c.port}/pubsub") as ws:
            missed, ack = pubsub_subscribe(ws, "late", epoch=epoch, after=str(after))
            assert ack["resumed"] is True and ack["epoch"] == epoch, ack
            assert ack["replayed"] == last - after and ack["seq"] == last, ack
            assert [m["seq"] for m in missed] == list(range(after + 1, last + 1))
            assert [m["data"] for m in missed] == ["m%d" % i for i in range(after + 1, last + 1)]
            for i in range(last + 1, last + 4):
                http_publish(a, "late", "m%d" % i)
            got = [recv_msg(ws) for _ in range(3)]
            assert [(m["seq"], m["data"]) for m in got] == \
                [(i, "m%d" % i) for i in range(last + 1, last + 4)]
            with pytest.raises(TimeoutError):   # nothing twice
                ws.recv(timeout=0.3)
        last += 3


def test_a_node_started_later_refuses_a_resume_older_than_the_engine_keeps(engine,
                                                                           tern_factory):
    """The engine keeps the topic's last 5 (the history's size); a node
    started after 12 were numbered reads back those 5 (8..12), so a resume
    after 7 there is whole, and one after 6 (7 is gone from the engine too)
    is told it is not (resumed false: the latest message, as for any resume
    too old), never given a part."""
    a, c, epoch = numbered_before(engine, tern_factory, "old", 12, 5)
    learns(c, "old", epoch, 12)
    wait_for(lambda: seqs(history(c, "old")) == list(range(8, 13)),
             "c read back what the engine keeps")
    with connect(f"ws://127.0.0.1:{c.port}/pubsub") as ws:
        missed, ack = pubsub_subscribe(ws, "old", epoch=epoch, after="6")
        assert ack["resumed"] is False and ack["epoch"] == epoch, ack
        assert [m["seq"] for m in missed] == [12] and ack["replayed"] == 1, (missed, ack)
    with connect(f"ws://127.0.0.1:{c.port}/pubsub") as ws:
        missed, ack = pubsub_subscribe(ws, "old", epoch=epoch, after="7")
        assert ack["resumed"] is True and ack["replayed"] == 5, ack
        assert [m["data"] for m in missed] == ["m%d" % i for i in range(8, 13)]
