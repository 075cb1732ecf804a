"""Presence and join/leave for GET /sse subscribers (src/app/serve_sse.c,
through src/app/serve_presence.c as /pubsub's): a stream subscribed to a
topic whose rule says presence=on is in that topic's presence with its
client id, user and info; with join-leave=on its join is pushed when the
stream starts and its leave when it ends, and the stream itself hears the
others' as `event: join` / `event: leave`; across nodes through Redis.

A stream's client that goes is found at the server's next write to it
(HTTP has no departure of its own): the tests publish until the stream is
gone. Every wait is for a condition, never a sleep."""
import asyncio
import json
import shutil

import pytest

from test_presence import (RULE, admin, ask, hear, redis_nodes, start,  # noqa: F401 (fixture)
                           stats, token, until, watch_through_redis)
from test_sse import SSE


def sse(t, topic, tok):
    """An /sse stream on topic with the token, its subscribe seen."""
    s = SSE(t.port, f"topic={topic}&token={tok}")
    assert s.status == 200
    assert s.next()["event"] == "subscribed"
    return s


async def gone(t, watcher, topic, seen, n):
    """Publishes on topic at t (so that the server writes to a stream whose
    client has gone, and finds it gone) until watcher counts n clients."""
    async def left():
        t.publish(topic, "anyone there?")
        return (await stats(watcher, topic, seen))[0] == n
    await until(left, f"{n} clients left in {topic}")


def test_an_sse_subscriber_is_in_presence_until_its_stream_ends(start):
    t = start(RULE)

    async def main():
        watcher = await t.open(token("w"))
        seen = []
        assert (await ask(watcher, seen, op="subscribe", topic="room.s"))["ok"] == "subscribe"
        s = sse(t, "room.s", token("reader", info={"r": 1}))
        assert await stats(watcher, "room.s", seen) == (2, 2)
        m = await ask(watcher, seen, op="presence", topic="room.s")
        reader = [e for e in m["presence"] if e["user"] == "reader"]
        assert len(reader) == 1 and reader[0]["info"] == {"r": 1}, m
        assert len(reader[0]["client"]) == 16, m
        status, body = admin(t, "/presence?topic=room.s")
        assert status == 200 and reader[0] in json.loads(body)["presence"], body
        status, body = admin(t, "/presence/stats?topic=room.s")
        assert status == 200 and json.loads(body)["clients"] == 2, body
        await hear(watcher, seen, "join", 1, "the stream's join")
        assert [e["join"] for e in seen if "join" in e] == [reader[0]], seen
        s.close()
        await gone(t, watcher, "room.s", seen, 1)
        await hear(watcher, seen, "leave", 1, "the stream's leave")
        assert [e["leave"] for e in seen if "leave" in e] == [reader[0]], seen
        await watcher.close()
    asyncio.run(main())


def test_an_sse_stream_hears_the_others_join_and_leave(start):
    t = start(RULE, "room.quiet join-leave=off")

    async def main():
        s = sse(t, "room.e", token("reader"))
        quiet = sse(t, "room.quiet", token("reader2"))
        other = await t.open(token("other", info={"o": 2}))
        for topic in ("room.e", "room.quiet"):
            assert (await ask(other, op="subscribe", topic=topic))["ok"] == "subscribe"
        join = s.next()
        assert join["event"] == "join", join
        joined = json.loads(join["data"])
        assert joined["topic"] == "room.e" and joined["join"]["user"] == "other", joined
        assert joined["join"]["info"] == {"o": 2} and len(joined["join"]["client"]) == 16
        assert (await ask(other, op="unsubscribe", topic="room.e"))["ok"] == "unsubscribe"
        leave = s.next()
        assert leave["event"] == "leave", leave
        assert json.loads(leave["data"]) == {"topic": "room.e", "leave": joined["join"]}
        # A message after them: nothing else came on either stream (room.quiet
        # has presence but no join-leave: no event there).
        t.publish("room.quiet", "after")
        assert quiet.next()["event"] == "message"
        await other.close()
        s.close()
        quiet.close()
    asyncio.run(main())


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server missing (scripts/install-deps.sh test)")
def test_an_sse_subscriber_on_another_node_through_redis(start):
    with redis_nodes(start) as (redis, a, b):
        async def main():
            watcher, seen = await watch_through_redis(redis, a, "room.r")
            s = sse(b, "room.r", token("far", info={"node": "b"}))
            await hear(watcher, seen, "join", 1, "b's stream's join on a")
            join = next(e["join"] for e in seen if "join" in e)
            assert join["user"] == "far" and join["info"] == {"node": "b"}, join

            async def both():
                return await stats(watcher, "room.r", seen) == (2, 2)
            await until(both, "b's stream in a's presence")
            m = await ask(watcher, seen, op="presence", topic="room.r")
            assert join in m["presence"], m
            s.close()
            await gone(b, watcher, "room.r", seen, 1)   # b writes to it, a counts
            await hear(watcher, seen, "leave", 1, "b's stream's leave on a")
            assert [e["leave"] for e in seen if "leave" in e] == [join], seen
            await watcher.close()
        asyncio.run(main())
