"""Presence and join/leave on /pubsub (src/app/serve_presence.c, the store
in src/app/presence.c), per topic rule (presence=on, join-leave=on): who is
subscribed, the counts, the events pushed to subscribers, the refusals, the
admin listener's GET /presence, and the store under churn.

The clients are websockets' asyncio ones; every wait is for a condition
(an answer, a count reached), never a sleep."""
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import shutil
import time
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect

from conftest import SLOW, wait_for
from engines import Redis, free_port

SECRET = b"presence-secret"
RULE = "room.* subscribe=token presence=on join-leave=on"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(sub, subscribe=("room.*",), info=None):
    claims = {"sub": sub, "exp": int(time.time()) + 3600,
              "tern": {"subscribe": list(subscribe)}}
    if info is not None:
        claims["info"] = info
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


@pytest.fixture
def start(tern_factory, tmp_path):
    """A server with tokens on and the given --topic rules (closed
    otherwise, as an operator's); t.open(tok) opens /pubsub with a token."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)

    def run(*rules, threads=1, extra=()):
        args = ["--token-hmac-secret-file", str(secret), "--threads", str(threads), *extra]
        for r in rules:
            args += ["--topic", r]
        t = tern_factory(*args, open_topics=False)
        t.open = lambda tok=None: connect(
            f"ws://127.0.0.1:{t.port}/pubsub" + (f"?token={tok}" if tok else ""),
            max_queue=None)
        return t
    return run


async def ask(ws, events=None, **msg):
    """Sends msg; returns the first answer ("ok" or "error"). Topic
    messages and join/leave events met meanwhile go to events (a list)."""
    await ws.send(json.dumps(msg))
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), 10 * SLOW))
        if "ok" in m or "error" in m:
            return m
        if events is not None:
            events.append(m)


async def until(cond, what, timeout=20.0):
    """Awaits cond() (a coroutine giving a bool) until it holds."""
    deadline = time.monotonic() + timeout * SLOW
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def hear(ws, seen, kind, n, what):
    """Awaits until seen holds n events of kind ("join" or "leave"),
    reading ws's events into it: each look is a round trip (a limits
    question), so what the server sent before its answer has been read."""
    async def enough():
        await ask(ws, seen, op="limits")
        return sum(1 for e in seen if kind in e) >= n
    await until(enough, what)


async def stats(ws, topic, events=None):
    m = await ask(ws, events, op="presence_stats", topic=topic)
    assert m["ok"] == "presence_stats", m
    return m["clients"], m["users"]


def admin(t, path, key=True):
    """GET path on the admin listener: (status, body)."""
    headers = {"Authorization": f"Bearer {t.api_key}"} if key else {}
    req = urllib.request.Request(f"{t.admin_base}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5 * SLOW) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_presence_lists_clients_users_and_info(start):
    t = start(RULE)

    async def main():
        a1 = await t.open(token("alice", info={"name": "Alice", "n": 1}))
        a2 = await t.open(token("alice", info={"name": "Alice", "n": 1}))
        b = await t.open(token("bob"))
        for ws in (a1, a2, b):
            assert (await ask(ws, op="subscribe", topic="room.a"))["ok"] == "subscribe"
        m = await ask(b, op="presence", topic="room.a")
        assert m["ok"] == "presence" and m["topic"] == "room.a", m
        assert (m["clients"], m["users"], m["truncated"]) == (3, 2, False), m
        entries = m["presence"]
        assert [e["user"] for e in entries] == ["alice", "alice", "bob"], entries
        assert entries[0]["info"] == {"name": "Alice", "n": 1}
        assert "info" not in entries[2]
        ids = [e["client"] for e in entries]
        assert len(set(ids)) == 3 and all(len(i) == 16 for i in ids), ids
        assert await stats(a1, "room.a") == (3, 2)
        # Another topic of the rule, with nobody: zeros, not an error.
        assert await stats(a1, "room.b") == (0, 0)
        # One client id per connection, the same in every topic.
        assert (await ask(a1, op="subscribe", topic="room.b"))["ok"] == "subscribe"
        m2 = await ask(a1, op="presence", topic="room.b")
        assert m2["presence"][0]["client"] == ids[0], (m2, ids)
        # Unsubscribing leaves at once; the topic's counts follow.
        assert (await ask(a2, op="unsubscribe", topic="room.a"))["ok"] == "unsubscribe"
        assert await stats(a1, "room.a") == (2, 2)
        assert (await ask(b, op="unsubscribe", topic="room.a"))["ok"] == "unsubscribe"
        assert await stats(a1, "room.a") == (1, 1)
        for ws in (a1, a2, b):
            await ws.close()
    asyncio.run(main())


def test_refused_where_the_rule_is_off_or_the_token_cannot_subscribe(start):
    t = start(RULE, "open.* subscribe=anyone", "lobby subscribe=token presence=off join-leave=on")

    async def main():
        other = await t.open(token("carol", subscribe=["elsewhere"]))
        anon = await t.open()
        for op in ("presence", "presence_stats"):
            # The token's rights do not cover room.a; an anonymous one has none.
            assert await ask(other, op=op, topic="room.a") == {"error": "forbidden", "op": op}
            assert await ask(anon, op=op, topic="room.a") == {"error": "forbidden", "op": op}
            # No rule says presence=on: off, whoever asks.
            assert await ask(anon, op=op, topic="open.x") == {"error": "presence off", "op": op}
            assert await ask(other, op=op, topic="lobby") == {"error": "presence off", "op": op}
            assert await ask(other, op=op) == {"error": "missing topic", "op": op}
        # The join/leave topics are the server's: no client subscribes or
        # publishes there, even where every topic is open.
        for op in ("subscribe", "publish"):
            m = await ask(anon, op=op, topic="\u0001open.x", data="x")
            assert m == {"error": "forbidden", "op": op}, m
        await other.close()
        await anon.close()
    asyncio.run(main())


def test_limit_truncates_and_says_so(start):
    t = start(RULE)

    async def main():
        tok = token("u")
        conns = [await t.open(tok) for _ in range(5)]
        for ws in conns:
            assert (await ask(ws, op="subscribe", topic="room.l"))["ok"] == "subscribe"
        m = await ask(conns[0], op="presence", topic="room.l", limit="2")
        assert (m["clients"], m["users"], m["truncated"], len(m["presence"])) == (5, 1, True, 2)
        m = await ask(conns[0], op="presence", topic="room.l", limit="5")
        assert (m["truncated"], len(m["presence"])) == (False, 5), m
        for bad in ("0", "1001", "x", "-1", ""):
            m = await ask(conns[0], op="presence", topic="room.l", limit=bad)
            assert m == {"error": "bad limit", "op": "presence"}, (bad, m)
        for ws in conns:
            await ws.close()
    asyncio.run(main())


@pytest.mark.parametrize("history", [[], ["--pubsub-history", "100"]], ids=["", "history"])
def test_join_and_leave_pushed_once_each_not_to_oneself(start, history):
    """With a history for every topic too: the events topic then keeps one,
    and the joins and leaves are still told once each, never replayed."""
    t = start(RULE, "room.quiet join-leave=off", extra=history)

    async def main():
        watcher = await t.open(token("w"))
        seen = []
        assert (await ask(watcher, seen, op="subscribe", topic="room.j"))["ok"] == "subscribe"
        assert (await ask(watcher, seen, op="subscribe", topic="room.quiet"))["ok"] == "subscribe"
        n = 20
        conns = [await t.open(token(f"user{i}", info={"i": i})) for i in range(n)]
        for ws in conns:
            own = []
            assert (await ask(ws, own, op="subscribe", topic="room.j"))["ok"] == "subscribe"
            assert (await ask(ws, own, op="subscribe", topic="room.quiet"))["ok"] == "subscribe"
            # Its own join is not pushed to it.
            assert not [e for e in own if "join" in e], own
        # Half leave by unsubscribing, half by closing.
        for i, ws in enumerate(conns):
            if i % 2:
                assert (await ask(ws, op="unsubscribe", topic="room.j"))["ok"] == "unsubscribe"
            else:
                await ws.close()

        await hear(watcher, seen, "leave", n, "every leave")
        joins = [e for e in seen if "join" in e]
        leaves = [e for e in seen if "leave" in e]
        assert len(joins) == n and len(leaves) == n, seen
        assert all(e["topic"] == "room.j" and "seq" not in e for e in joins + leaves), seen
        assert sorted(e["join"]["user"] for e in joins) == sorted(f"user{i}" for i in range(n))
        assert {e["join"]["client"] for e in joins} == {e["leave"]["client"] for e in leaves}
        assert all(e["join"]["info"] == {"i": int(e["join"]["user"][4:])} for e in joins)
        # Each client's join came before its leave.
        order = [(("join" in e), e.get("join", e.get("leave"))["client"]) for e in seen]
        for cid in {c for _, c in order}:
            assert order.index((True, cid)) < order.index((False, cid))
        # room.quiet has presence but not join-leave (its rule turns off what
        # room.* gives): nothing pushed there.
        assert not [e for e in seen if e.get("topic") == "room.quiet"], seen
        for i, ws in enumerate(conns):
            if i % 2:
                await ws.close()
        await watcher.close()
    asyncio.run(main())


def test_a_crowd_of_joins_waits_for_the_throttle(start):
    """--join-leave-throttle 1000: the first join on a quiet topic is
    pushed at once, the two that follow within the second wait for the next
    pass, a second after the first one at least (measured from before the
    first join, so that a slow machine cannot fail it). With the default
    (5 ms) test_join_and_leave_pushed_once_each_not_to_oneself's crowd
    arrives whole."""
    t = start(RULE, extra=("--join-leave-throttle", "1000"))

    async def main():
        watcher = await t.open(token("w"))
        seen = []
        assert (await ask(watcher, seen, op="subscribe", topic="room.t"))["ok"] == "subscribe"
        t0 = time.monotonic()
        conns = []
        for name in ("a", "b", "c"):
            ws = await t.open(token(name))
            assert (await ask(ws, op="subscribe", topic="room.t"))["ok"] == "subscribe"
            conns.append(ws)
        await hear(watcher, seen, "join", 1, "a's join")
        await hear(watcher, seen, "join", 3, "b's and c's joins")
        assert time.monotonic() - t0 >= 0.95
        assert [e["join"]["user"] for e in seen if "join" in e] == ["a", "b", "c"]
        for ws in conns + [watcher]:
            await ws.close()
    asyncio.run(main())


def test_a_closed_connection_leaves_presence_at_once(start):
    t = start(RULE)

    async def main():
        watcher = await t.open(token("w"))
        seen = []
        assert (await ask(watcher, seen, op="subscribe", topic="room.c"))["ok"] == "subscribe"
        gone = await t.open(token("gone"))
        assert (await ask(gone, op="subscribe", topic="room.c"))["ok"] == "subscribe"
        assert await stats(watcher, "room.c", seen) == (2, 2)
        # Cut without a close frame: the TCP connection alone ends.
        gone.transport.abort()

        async def left():
            return await stats(watcher, "room.c", seen) == (1, 1)
        await until(left, "the cut connection out of presence")
        m = await ask(watcher, seen, op="presence", topic="room.c")
        assert [e["user"] for e in m["presence"]] == ["w"], m
        # The leave was published when the connection went; it may reach
        # the watcher behind the answer above (a batch): waited for.
        await hear(watcher, seen, "leave", 1, "the leave")
        assert [e["leave"]["user"] for e in seen if "leave" in e] == ["gone"], seen
        await watcher.close()
    asyncio.run(main())


def test_churn_of_300_subscribers_from_several_tasks(start):
    """Two loops; six tasks join 50 subscribers each, then six more join 50
    each while the first ones leave (unsubscribing, closing, or cut), then
    those leave too: at every quiet point the counts, the list and the
    events agree, and each join and leave is told once."""
    t = start(RULE, threads=2)
    tasks, each = 6, 50
    total = tasks * each

    async def main():
        watcher = await t.open(token("w"))
        seen = []
        assert (await ask(watcher, seen, op="subscribe", topic="room.churn"))["ok"] == "subscribe"

        async def join(k):
            conns = []
            for i in range(each):
                ws = await t.open(token(f"user{i % 10}"))   # 10 users, many clients each
                assert (await ask(ws, op="subscribe", topic="room.churn"))["ok"] == "subscribe"
                conns.append(ws)
            return conns

        async def leave(conns):
            for i, ws in enumerate(conns):
                if i % 3 == 0:
                    assert (await ask(ws, op="unsubscribe", topic="room.churn"))["ok"]
                    await ws.close()
                elif i % 3 == 1:
                    await ws.close()
                else:
                    ws.transport.abort()

        async def quiet(joined, left, what):
            """The store and the events once joined joins and left leaves
            have been told: the list is the watcher and who has not left."""
            await hear(watcher, seen, "join", joined, what + ": the joins")
            await hear(watcher, seen, "leave", left, what + ": the leaves")
            joins = [e["join"]["client"] for e in seen if "join" in e]
            leaves = [e["leave"]["client"] for e in seen if "leave" in e]
            assert (len(joins), len(leaves)) == (joined, left), what
            assert len(set(joins)) == joined and set(leaves) <= set(joins), what
            m = await ask(watcher, seen, op="presence", topic="room.churn", limit="1000")
            here = joined - left + 1
            assert (m["clients"], m["users"], m["truncated"]) == (here, 11 if here > 1 else 1,
                                                                  False), (what, m)
            listed = {e["client"] for e in m["presence"]}
            assert len(listed) == here and set(joins) - set(leaves) < listed, what

        first = await asyncio.gather(*(join(k) for k in range(tasks)))
        await quiet(total, 0, "joined")
        # The first ones leave while as many others join, on both loops.
        churn = await asyncio.gather(*(leave(g) for g in first),
                                     *(join(k) for k in range(tasks)))
        second = churn[tasks:]

        async def settled():
            return await stats(watcher, "room.churn", seen) == (total + 1, 11)
        await until(settled, "the first ones out of presence")
        await quiet(2 * total, total, "churned")
        await asyncio.gather(*(leave(g) for g in second))

        async def empty():
            return await stats(watcher, "room.churn", seen) == (1, 1)
        await until(empty, "every subscriber out of presence")
        await quiet(2 * total, 2 * total, "left")
        await watcher.close()
    asyncio.run(main())


def test_admin_presence_keyed_like_publish(start):
    t = start(RULE, "open.* subscribe=anyone")

    async def main():
        a = await t.open(token("alice", info="hi"))
        assert (await ask(a, op="subscribe", topic="room.adm"))["ok"] == "subscribe"
        status, body = admin(t, "/presence?topic=room.adm")
        assert status == 200, body
        m = json.loads(body)
        assert "ok" not in m and m["topic"] == "room.adm", m
        assert (m["clients"], m["users"], m["truncated"]) == (1, 1, False)
        assert m["presence"][0]["user"] == "alice" and m["presence"][0]["info"] == "hi"
        status, body = admin(t, "/presence/stats?topic=room.adm")
        assert status == 200 and json.loads(body) == {"topic": "room.adm", "clients": 1,
                                                       "users": 1}, body
        status, body = admin(t, "/presence?topic=room.adm", key=False)
        assert status == 401 and "--api-key-file" in body, body
        assert admin(t, "/presence?topic=open.x")[0] == 404
        assert admin(t, "/presence")[0] == 400
        assert admin(t, "/presence?topic=room.adm&limit=0")[0] == 400
        assert admin(t, "/presence?topic=room.adm&limit=1")[0] == 200
        await a.close()
    asyncio.run(main())


def test_a_token_with_too_large_info_is_refused(start):
    t = start(RULE)

    async def main():
        with pytest.raises(Exception) as e:
            await t.open(token("big", info="x" * 2000))
        assert "401" in str(e.value)
        ws = await t.open(token("small", info="x" * 1000))
        await ws.close()
    asyncio.run(main())


@contextlib.contextmanager
def redis_nodes(start):
    """Two nodes with RULE through a Redis of their own: (redis, a, b), a
    with one thread, b with two, both linked."""
    redis = Redis(free_port())
    redis.start()
    try:
        url = f"redis://127.0.0.1:{redis.port}"
        a = start(RULE, extra=["--redis", url])
        b = start(RULE, extra=["--redis", url], threads=2)
        wait_for(lambda: a.stats()["redis"]["connected"] and b.stats()["redis"]["connected"],
                 "both nodes linked to Redis")
        yield redis, a, b
    finally:
        redis.stop()


async def watch_through_redis(redis, a, topic):
    """A watcher on node a subscribed to topic, once a's events channel for
    it is in Redis (so that the other node's join reaches it): (ws, seen)."""
    watcher = await a.open(token("w"))
    seen = []
    assert (await ask(watcher, seen, op="subscribe", topic=topic))["ok"] == "subscribe"
    wait_for(lambda: redis.command("PUBSUB", "NUMSUB", "tern:\x01" + topic)[1] == 1,
             "a's events channel in Redis")
    return watcher, seen


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server missing (scripts/install-deps.sh test)")
def test_through_redis_join_and_leave_cross_nodes(start):
    """Join and leave travel wherever the topic's messages go, through
    --redis too (presence across nodes: test_presence_nodes.py)."""
    with redis_nodes(start) as (redis, a, b):
        async def main():
            watcher, seen = await watch_through_redis(redis, a, "room.r")
            other = await b.open(token("far", info={"node": "b"}))
            assert (await ask(other, op="subscribe", topic="room.r"))["ok"] == "subscribe"
            await hear(watcher, seen, "join", 1, "b's join on a")
            join = next(e["join"] for e in seen if "join" in e)
            assert join["user"] == "far" and join["info"] == {"node": "b"}, join
            # Each node lists both nodes' subscribers.
            async def both(ws, events=None):
                return await stats(ws, "room.r", events) == (2, 2)
            await until(lambda: both(watcher, seen), "b's subscriber in a's presence")
            await until(lambda: both(other), "a's subscriber in b's presence")
            await other.close()
            await hear(watcher, seen, "leave", 1, "b's leave on a")
            leaves = [e["leave"] for e in seen if "leave" in e]
            assert [x["client"] for x in leaves] == [join["client"]], seen
            await watcher.close()
        asyncio.run(main())

