"""Presence across nodes (src/app/presence_nodes.c): two `tern serve` nodes
joined by a bridge, over a real redis-server and a real nats-server alike.

Checked: presence, presence_stats and the admin listener's /presence on
one node list and count the other node's subscribers (a user on both nodes
counted once), join and leave events of the other node's subscribers heard
once each; churn of hundreds of subscribers spread over both nodes ends
with the same exact presence on both; a node killed with SIGKILL leaves no
ghost: its subscribers are gone from the other node's presence within the
expiry (15 s), with one leave each for the subscribers of a join-leave=on
topic; a node stopped with SIGTERM is gone from the other's presence at
once (its closing connections' leaves reach it then, not at the expiry);
a node restarted under the same --node-name replaces its old entries at
its first announcement, with their leaves said by the other node.

The clients are websockets' asyncio ones; every wait is for a condition,
never a sleep."""
import asyncio
import json
import random
import shutil
import signal

import pytest

from conftest import SLOW, Server, wait_for
from engines import Nats, Redis, free_port
from test_presence import RULE, admin, ask, hear, stats, token, until

from websockets.asyncio.client import connect

SECRET = b"presence-secret"   # test_presence's token() signs with it

# presence_nodes.h: a silent node is dropped after 3 announcements of 5 s.
EXPIRY = 15.0


@pytest.fixture(params=["redis", "nats"])
def broker(request):
    """A redis-server or a nats-server on a free port: its URL."""
    server = request.param + "-server"
    if shutil.which(server) is None:
        pytest.skip(f"{server} missing (scripts/install-deps.sh test)")
    b = Redis(free_port()) if request.param == "redis" else Nats(free_port())
    b.start()
    yield f"{request.param}://127.0.0.1:{b.port}"
    b.stop()


@pytest.fixture
def nodes(broker, tmp_path):
    """start(name, threads=1): a node with tokens on, RULE, --bridge to the
    broker, once linked to it; t.open(tok) opens /pubsub. Each node is
    stopped at the end (a killed one just reaped)."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    started = []

    def start(name, threads=1):
        t = Server(["--token-hmac-secret-file", str(secret), "--threads", str(threads),
                    "--topic", RULE, "--bridge", broker, "--node-name", name],
                   open_topics=False)
        started.append(t)
        t.open = lambda tok: connect(f"ws://127.0.0.1:{t.port}/pubsub?token={tok}",
                                     max_queue=None)
        wait_for(lambda: t.stats()["bridge"]["connected"], f"node {name} linked")
        return t
    yield start
    for t in started:
        killed = t.proc.poll() is not None
        code = t.stop()
        assert killed or code == 0, f"tern exited {code}: {t.stderr}"


async def users_of(ws, topic, events=None):
    """The presence list's users on ws's node (sorted), and its counts."""
    m = await ask(ws, events, op="presence", topic=topic, limit="1000")
    assert m["ok"] == "presence" and not m["truncated"], m
    return sorted(e["user"] for e in m["presence"]), (m["clients"], m["users"])


async def subscribers(node, users, topic, events=None):
    """One /pubsub connection per user on node, each subscribed to topic
    (what their answers meet goes to events)."""
    conns = [await node.open(token(u)) for u in users]
    for ws in conns:
        assert (await ask(ws, events, op="subscribe", topic=topic))["ok"] == "subscribe"
    return conns


async def linked(watcher, seen, other, topic):
    """Once watcher (subscribed to topic with join-leave=on) hears joins
    from node other: its node's subscription to the events topic reached
    the broker (asynchronously, after the subscribe's answer). A probe of
    other's joins and leaves until watcher hears one; its events are then
    taken out of seen."""
    probe = await other.open(token("probe"))
    for _ in range(int(200 * SLOW)):
        assert (await ask(probe, op="subscribe", topic=topic))["ok"] == "subscribe"
        assert (await ask(probe, op="unsubscribe", topic=topic))["ok"] == "unsubscribe"
        await ask(watcher, seen, op="limits")
        if any("join" in e for e in seen):
            break
        await asyncio.sleep(0.05)
    await probe.close()
    # The rounds after the one heard may still be on their way: other's
    # events come in its order, so once a marker's leave (after them all)
    # is heard, every probe event is in seen and none comes later.
    marker = await other.open(token("marker"))
    assert (await ask(marker, op="subscribe", topic=topic))["ok"] == "subscribe"
    assert (await ask(marker, op="unsubscribe", topic=topic))["ok"] == "unsubscribe"
    await marker.close()

    async def marker_left():
        await ask(watcher, seen, op="limits")
        return any(e.get("leave", {}).get("user") == "marker" for e in seen)
    await until(marker_left, "the marker's leave")

    async def no_probe():
        users = (await users_of(watcher, topic, seen))[0]
        return "probe" not in users and "marker" not in users
    await until(no_probe, "the probe and the marker gone")
    seen.clear()


def test_presence_and_stats_answer_for_both_nodes(nodes):
    a = nodes("a")
    b = nodes("b", threads=2)

    async def main():
        seen = []
        watcher = await a.open(token("w"))
        assert (await ask(watcher, seen, op="subscribe", topic="room.x"))["ok"] == "subscribe"
        await linked(watcher, seen, b, "room.x")
        far = await b.open(token("far", info={"node": "b"}))
        assert (await ask(far, op="subscribe", topic="room.x"))["ok"] == "subscribe"
        # The same user on both nodes: two clients, one user.
        twin_a, twin_b = await a.open(token("twin")), await b.open(token("twin"))
        for ws in (twin_a, twin_b):
            assert (await ask(ws, op="subscribe", topic="room.x"))["ok"] == "subscribe"

        async def whole(ws, events=None):
            return (await users_of(ws, "room.x", events))[0] == ["far", "twin", "twin", "w"]
        await until(lambda: whole(watcher, seen), "a lists b's subscribers")
        await until(lambda: whole(far), "b lists a's subscribers")
        assert await stats(watcher, "room.x", seen) == (4, 3)
        assert await stats(far, "room.x") == (4, 3)
        m = await ask(watcher, seen, op="presence", topic="room.x")
        assert {"user": "far", "info": {"node": "b"}}.items() <= \
            next(e for e in m["presence"] if e["user"] == "far").items(), m
        status, body = admin(a, "/presence?topic=room.x")
        assert status == 200 and json.loads(body)["clients"] == 4, body
        status, body = admin(b, "/presence/stats?topic=room.x")
        assert status == 200 and (json.loads(body)["users"]) == 3, body

        # b's joins and leaves reach a's subscriber once each.
        await hear(watcher, seen, "join", 3, "the joins on a")
        await far.close()
        await twin_b.close()

        async def gone():
            return (await users_of(watcher, "room.x", seen))[0] == ["twin", "w"]
        await until(gone, "b's leavers gone from a")
        await hear(watcher, seen, "leave", 2, "the leaves on a")
        joins = [e["join"]["user"] for e in seen if "join" in e]
        leaves = [e["leave"]["user"] for e in seen if "leave" in e]
        assert sorted(joins) == ["far", "twin", "twin"], seen
        assert sorted(leaves) == ["far", "twin"], seen
        assert await stats(twin_a, "room.x") == (2, 2)
        for ws in (watcher, twin_a):
            await ws.close()
    asyncio.run(main())


def test_churn_across_two_nodes_ends_exact_on_both(nodes):
    """1000 subscribers join from both nodes, half of them leave (closing or
    unsubscribing) while others still join: both nodes end listing exactly
    who is left."""
    a = nodes("a", threads=2)
    b = nodes("b")
    total = 1000
    rng = random.Random(40)

    async def main():
        conns = {}

        async def join(k):
            node = a if k % 2 else b
            ws = await node.open(token(f"u{k}"))
            assert (await ask(ws, op="subscribe", topic="room.churn"))["ok"] == "subscribe"
            conns[k] = ws

        async def leave(k):
            ws = conns.pop(k)
            if k % 3:
                await ws.close()
            else:
                assert (await ask(ws, op="unsubscribe", topic="room.churn"))["ok"]

        first = list(range(total // 2))
        await asyncio.gather(*(join(k) for k in first))
        leaving = rng.sample(first, total // 4)
        await asyncio.gather(*(leave(k) for k in leaving),
                             *(join(k) for k in range(total // 2, total)))
        more = rng.sample(range(total // 2, total), total // 4)
        await asyncio.gather(*(leave(k) for k in more))
        want = sorted(f"u{k}" for k in conns)
        watch_a, watch_b = await a.open(token("wa")), await b.open(token("wb"))

        async def exact(ws):
            users, counts = await users_of(ws, "room.churn")
            return users == want and counts == (len(want), len(want))
        await until(lambda: exact(watch_a), "a's presence exact", timeout=40)
        await until(lambda: exact(watch_b), "b's presence exact", timeout=40)
        await asyncio.gather(*(ws.close() for ws in conns.values()))

        async def empty(ws):
            return (await users_of(ws, "room.churn"))[1] == (0, 0)
        await until(lambda: empty(watch_a), "a's presence empty", timeout=40)
        await until(lambda: empty(watch_b), "b's presence empty", timeout=40)
        await watch_a.close()
        await watch_b.close()
    asyncio.run(main())


def test_a_killed_node_leaves_no_ghost(nodes):
    a = nodes("a")
    b = nodes("b")
    n = 20

    async def main():
        seen = []
        watcher, = await subscribers(a, ["w"], "room.k", seen)
        far = await subscribers(b, [f"far{k}" for k in range(n)], "room.k")

        async def all_there():
            return await stats(watcher, "room.k", seen) == (n + 1, n + 1)
        await until(all_there, "b's subscribers on a")
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()

        async def gone():
            return await stats(watcher, "room.k", seen) == (1, 1)
        await until(gone, "b's subscribers gone from a", timeout=EXPIRY + 15)
        # a, the only live node, says each one's leave once.
        await hear(watcher, seen, "leave", n, "a leave per subscriber of b")
        leaves = sorted(e["leave"]["user"] for e in seen if "leave" in e)
        assert leaves == sorted(f"far{k}" for k in range(n)), seen
        status, body = admin(a, "/presence?topic=room.k")
        assert status == 200 and [e["user"] for e in json.loads(body)["presence"]] == ["w"], body
        for ws in far:
            try:
                await ws.close()
            except OSError:
                pass
        await watcher.close()
    asyncio.run(main())


def test_a_node_stopped_gracefully_is_gone_at_once(nodes):
    """SIGTERM: the node's connections close before it ends, and their
    leaves reach the other node then, not at the expiry (which would say
    each leave a second time)."""
    a = nodes("a")
    b = nodes("b")
    n = 5

    async def main():
        seen = []
        watcher, = await subscribers(a, ["w"], "room.s", seen)
        await linked(watcher, seen, b, "room.s")
        await subscribers(b, [f"far{k}" for k in range(n)], "room.s")

        async def count(want):
            return await stats(watcher, "room.s", seen) == want
        await until(lambda: count((n + 1, n + 1)), "b's subscribers on a")
        # In a thread: the clients answer b's closes meanwhile.
        assert await asyncio.to_thread(b.stop) == 0
        await until(lambda: count((1, 1)), "b's subscribers gone from a", timeout=EXPIRY / 3)
        await hear(watcher, seen, "leave", n, "a leave per subscriber of b")
        leaves = sorted(e["leave"]["user"] for e in seen if "leave" in e)
        assert leaves == sorted(f"far{k}" for k in range(n)), seen
        await watcher.close()
    asyncio.run(main())


def test_a_restarted_node_replaces_its_old_entries(nodes):
    """A node killed and started again under the same --node-name (a new
    instance): its first announcement replaces what the other node kept
    of the old one, before the expiry, with a leave for each old one."""
    a = nodes("a")
    b = nodes("b")

    async def main():
        seen = []
        watcher, = await subscribers(a, ["w"], "room.r", seen)
        old = await subscribers(b, [f"old{k}" for k in range(3)], "room.r")

        async def users(want):
            return (await users_of(watcher, "room.r", seen))[0] == want
        await until(lambda: users(["old0", "old1", "old2", "w"]), "b's subscribers on a")
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        new, = await subscribers(nodes("b"), ["new"], "room.r")
        await until(lambda: users(["new", "w"]), "the new b's subscriber alone on a",
                    timeout=EXPIRY / 3)
        await hear(watcher, seen, "leave", 3, "a leave per subscriber of the old b")
        assert sorted(e["leave"]["user"] for e in seen if "leave" in e) == \
            ["old0", "old1", "old2"], seen
        for ws in old:
            try:
                await ws.close()
            except OSError:
                pass
        await new.close()
        await watcher.close()
    asyncio.run(main())
