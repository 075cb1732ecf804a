"""tern serve's server API on the admin listener (src/app/serve_api.c):
history with paging, topics with subscriber counts, one message to several
topics, a user disconnected or unsubscribed on every thread; and user
topics (`subscribe=user`: "chat:#alice" is alice's alone). Every call's
errors are asked for."""
import contextlib
import json
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import SLOW, wait_for
from test_tokens import SECRET, token

CALLS = ["/history", "/topics", "/publish", "/disconnect", "/unsubscribe"]


def api(t, path, body, key=True):
    """POST body (a dict, or bytes as they are) to the admin listener:
    (status, the answer as JSON, or as text when it is not)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {t.api_key if key is True else key}"} if key else {}
    req = urllib.request.Request(t.admin_base + path, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5 * SLOW) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def bad(t, path, body, status=400):
    """The call is refused with status; its {"error":...}."""
    got, answer = api(t, path, body)
    assert got == status, (path, body, got, answer)
    return answer["error"]


def ask(ws, **msg):
    ws.send(json.dumps(msg))
    return json.loads(ws.recv(timeout=5 * SLOW))


def user_token(sub, **rights):
    return token({"sub": sub, "exp": int(time.time()) + 3600, "tern": rights})


@pytest.fixture
def served(tern_factory, tmp_path):
    """Two threads, tokens, open topics (with a history of 10 under
    "h."), user topics under "chat:" and "dm:"."""
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    return tern_factory("--threads", "2", "--token-hmac-secret-file", str(f), "--feed", "off",
                        "--topic", "h.* history=10",
                        "--topic", "chat:* subscribe=user publish=user",
                        "--topic", "dm:* subscribe=user publish=none")


def ws_url(t, sub=None):
    return f"ws://127.0.0.1:{t.port}/pubsub" + (f"?token={user_token(sub)}" if sub else "")


# ---- the key ---------------------------------------------------------------

def test_every_call_needs_the_key(served):
    for path in CALLS:
        status, text = api(served, path, {}, key=None)
        assert status == 401 and "Authorization: Bearer" in text, (path, status, text)
        assert api(served, path, {}, key="wrong")[0] == 401, path


def test_without_a_key_file_every_call_is_403(tern_factory):
    t = tern_factory(api_key=False)
    for path in CALLS:
        status, text = api(t, path, {}, key="anything")
        assert status == 403 and "--api-key-file" in text, (path, status, text)


def test_bodies_that_are_not_one_json_object(served):
    for path in CALLS:
        for body in (b"", b"[]", b"nope", b'{"a":', b'{} x', b'{"a" 1}', b'{,}'):
            err = bad(served, path, body)
            assert err in ("the body must be a JSON object", "bad JSON") \
                or err.startswith("unknown field"), (path, body, err)
        assert bad(served, path, {"bogus": 1}) == "unknown field bogus"
        assert bad(served, path, b'{"x\\"y":1}') == 'unknown field x"y'   # escaped back
        assert bad(served, path, b"{" + b" " * (1 << 20) + b"}", 413) == "body over 1 MiB"


# ---- POST /publish: one message, several topics ----------------------------

def test_publish_to_several_topics(served):
    with connect(ws_url(served)) as ws:
        assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
        assert ask(ws, op="subscribe", topic="b")["ok"] == "subscribe"
        status, got = api(served, "/publish", {"topics": ["a", "b", "c"], "data": "hi é",
                                              "key": "k"})
        assert status == 200, got
        assert got == {"results": [{"topic": "a", "seq": 1, "subscribers": 1},
                                   {"topic": "b", "seq": 1, "subscribers": 1},
                                   {"topic": "c", "seq": 0, "subscribers": 0}]}
        seen = {json.loads(ws.recv(timeout=5 * SLOW))["topic"] for _ in range(2)}
        assert seen == {"a", "b"}


@pytest.mark.parametrize("body,why", [
    ({"data": "x"}, "missing topics"),
    ({"topics": ["h.a"]}, "missing data"),
    ({"topics": [], "data": "x"}, "topics: at least one expected"),
    ({"topics": "h.a", "data": "x"}, "topics: an array of strings expected"),
    ({"topics": ["h.a", 1], "data": "x"}, "a topic: a string expected"),
    ({"topics": ["h.a", ""], "data": "x"}, "a topic is empty"),
    ({"topics": ["h.a", "t" * 257], "data": "x"}, "a topic too long (256 bytes at most)"),
    ({"topics": ["h.a", "b", "h.a"], "data": "x"}, "topics: a topic is named twice"),
    ({"topics": ["h.a"] + [f"t{i}" for i in range(100)], "data": "x"}, "topics: 100 at most"),
    ({"topics": ["h.a"], "data": 5}, "data: a string expected"),
    ({"topics": ["h.a"], "data": "x", "key": ""}, "key is empty"),
    ({"topics": ["h.a"], "data": "x", "key": "k" * 129}, "key too long (128 bytes at most)"),
])
def test_publish_checks_everything_before_publishing_anything(served, body, why):
    assert bad(served, "/publish", body) == why
    # nothing of a refused call was published: h.a (with a history) has none
    assert api(served, "/history", {"topic": "h.a"})[1]["epoch"] is None


def test_publish_passes_data_on_as_written(served):
    with connect(ws_url(served)) as ws:
        assert ask(ws, op="subscribe", topic="a")["ok"] == "subscribe"
        body = b'{"topics":["a"],"data":"\\u0000 \\ud83d\\ude00 \\" \xc3\xa9"}'
        assert api(served, "/publish", body)[1]["results"][0]["seq"] == 1
        assert json.loads(ws.recv(timeout=5 * SLOW))["data"] == '\x00 \U0001f600 " \xe9'


def test_publish_refuses_a_bad_string(served):
    for body in (b'{"topics":["a"],"data":"\\ud800"}', b'{"topics":["a"],"data":"\xff"}',
                 b'{"topics":["a\\u0000b"],"data":"x"}', b'{"topics":["a"],"data":"\x01"}'):
        assert bad(served, "/publish", body) in ("data: a string expected",
                                                  "a topic: a string expected"), body


# ---- POST /history -----------------------------------------------------------

def test_history_pages_both_ways(served):
    for i in range(1, 16):   # h.* keeps 10: 6..15
        api(served, "/publish", {"topics": ["h.x"], "data": f"m{i}"})
    status, page = api(served, "/history", {"topic": "h.x", "limit": 4})
    assert status == 200, page
    epoch = page["epoch"]
    assert len(epoch) == 16 and page["first"] == 6 and page["last"] == 15
    assert [m["seq"] for m in page["messages"]] == [6, 7, 8, 9]
    assert page["messages"][0] == {"topic": "h.x", "seq": 6, "data": "m6"}
    seqs, nxt = [], 0
    while nxt is not None:   # every page, oldest first, with the epoch
        status, page = api(served, "/history", {"topic": "h.x", "from": nxt, "limit": 3,
                                                "epoch": epoch})
        seqs += [m["seq"] for m in page["messages"]]
        nxt = page["next"]
    assert seqs == list(range(6, 16))
    seqs, body = [], {"topic": "h.x", "order": "newest", "limit": 4}
    while True:
        page = api(served, "/history", body)[1]
        seqs += [m["seq"] for m in page["messages"]]
        if page["next"] is None:
            break
        body["from"] = page["next"]
    assert seqs == list(range(15, 5, -1))
    page = api(served, "/history", {"topic": "h.x", "order": "newest", "from": 8})[1]
    assert [m["seq"] for m in page["messages"]] == [8, 7, 6] and page["next"] is None
    page = api(served, "/history", {"topic": "h.x", "from": 20})[1]
    assert page["messages"] == [] and page["next"] is None
    # another epoch: the client's seqs mean nothing under this one
    status, got = api(served, "/history", {"topic": "h.x", "epoch": "1"})
    assert status == 409 and got == {"error": "epoch changed", "epoch": epoch}


def test_history_of_a_topic_without_one(served):
    assert api(served, "/history", {"topic": "nobody"})[1] == {
        "topic": "nobody", "epoch": None, "first": 0, "last": 0, "messages": [], "next": None}
    with connect(ws_url(served)) as ws:   # exists while subscribed, with no history
        ask(ws, op="subscribe", topic="plain")
        page = api(served, "/history", {"topic": "plain"})[1]
        assert page["epoch"] and page["messages"] == []


@pytest.mark.parametrize("body,why", [
    ({}, "missing topic"),
    ({"topic": ""}, "topic is empty"),
    ({"topic": 1}, "topic: a string expected"),
    ({"topic": "t" * 257}, "topic too long (256 bytes at most)"),
    ({"topic": "t", "limit": 0}, "limit: a whole number from 1 to 1000 expected"),
    ({"topic": "t", "limit": 1001}, "limit: a whole number from 1 to 1000 expected"),
    ({"topic": "t", "limit": 1.5}, "limit: a whole number from 1 to 1000 expected"),
    ({"topic": "t", "from": -1}, "from: a whole number from 0 to 9223372036854775807 expected"),
    ({"topic": "t", "order": "up"}, 'order: "oldest" or "newest" expected'),
    ({"topic": "t", "epoch": "xyz"}, "epoch: 1 to 16 hex digits expected, not 0"),
    ({"topic": "t", "epoch": "0"}, "epoch: 1 to 16 hex digits expected, not 0"),
])
def test_history_errors(served, body, why):
    assert bad(served, "/history", body) == why


# ---- POST /topics ------------------------------------------------------------

def test_topics_with_their_subscribers_paged(served):
    with contextlib.ExitStack() as stack:
        for topic, n in (("room.a", 2), ("room.b", 1), ("other", 1)):
            for _ in range(n):
                ws = stack.enter_context(connect(ws_url(served)))
                assert ask(ws, op="subscribe", topic=topic)["ok"] == "subscribe"
        api(served, "/publish", {"topics": ["h.kept"], "data": "x"})   # a history, no one
        status, got = api(served, "/topics", {"prefix": "room.", "limit": 1})
        assert status == 200, got
        assert [(t["topic"], t["subscribers"]) for t in got["topics"]] == [("room.a", 2)]
        assert got["next"] == "room.a"
        got = api(served, "/topics", {"prefix": "room.", "after": got["next"]})[1]
        assert [(t["topic"], t["subscribers"]) for t in got["topics"]] == [("room.b", 1)]
        assert got["next"] is None
        every = api(served, "/topics", {})[1]["topics"]
        assert [t["topic"] for t in every] == ["h.kept", "other", "room.a", "room.b"]
        kept = every[0]
        assert kept["history"] and kept["seq"] == 1 and kept["subscribers"] == 0
        assert not every[1]["history"] and len(every[1]["epoch"]) == 16
    # gone with their subscribers; the history stays
    wait_for(lambda: [t["topic"] for t in api(served, "/topics", {})[1]["topics"]] == ["h.kept"],
             "the topics to go with their last subscriber")


@pytest.mark.parametrize("body,why", [
    ({"prefix": 1}, "prefix: a string expected"),
    ({"after": "t" * 257}, "after too long (256 bytes at most)"),
    ({"limit": 0}, "limit: a whole number from 1 to 1000 expected"),
    ({"limit": "5"}, "limit: a whole number from 1 to 1000 expected"),
])
def test_topics_errors(served, body, why):
    assert bad(served, "/topics", body) == why


# ---- user topics -------------------------------------------------------------

def test_user_topics_are_their_users_alone(served):
    with connect(ws_url(served, "alice")) as alice, connect(ws_url(served, "bob")) as bob, \
            connect(ws_url(served)) as nobody:
        assert ask(alice, op="subscribe", topic="chat:#alice")["ok"] == "subscribe"
        assert ask(bob, op="subscribe", topic="chat:#alice")["error"] == "forbidden"
        assert ask(nobody, op="subscribe", topic="chat:#alice")["error"] == "forbidden"
        assert ask(alice, op="subscribe", topic="chat:#bob")["error"] == "forbidden"
        assert ask(alice, op="subscribe", topic="chat:alice")["error"] == "forbidden"   # no '#'
        assert ask(alice, op="subscribe", topic="chat:#alicex")["error"] == "forbidden"
        # a topic for several users; publish=user on chat:, none on dm:
        assert ask(alice, op="subscribe", topic="dm:#bob,alice")["ok"] == "subscribe"
        assert ask(bob, op="subscribe", topic="dm:#bob,alice")["ok"] == "subscribe"
        assert ask(nobody, op="subscribe", topic="dm:#bob,alice")["error"] == "forbidden"
        assert ask(alice, op="publish", topic="chat:#bob,alice", data="hi")["ok"] == "publish"
        assert ask(bob, op="publish", topic="chat:#alice", data="x")["error"] == "forbidden"
        assert ask(alice, op="publish", topic="dm:#bob,alice", data="x")["error"] == "forbidden"


# ---- a user's connections, on every thread -------------------------------------

def open_on_every_thread(t, stack, sub, least=2):
    """sub's connections, opened until each of t's threads holds one."""
    def per_thread():
        return [th["connections"] for th in t.stats()["each"]]
    conns, on = [], set()
    while len(conns) < least or (len(on) < len(per_thread()) and len(conns) < 64):
        before = per_thread()
        conns.append(stack.enter_context(connect(ws_url(t, sub))))
        wait_for(lambda: sum(per_thread()) > sum(before), "the connection to count")
        on |= {i for i, (a, b) in enumerate(zip(before, per_thread())) if b > a}
    assert on == {0, 1}, "the kernel put every connection on one thread"
    return conns


def test_disconnect_a_user_on_every_thread(served):
    with contextlib.ExitStack() as stack:
        alice = open_on_every_thread(served, stack, "alice")
        bob = stack.enter_context(connect(ws_url(served, "bob")))
        status, got = api(served, "/disconnect", {"user": "alice", "code": 4008,
                                                  "reason": "bye"})
        assert status == 200 and got == {"user": "alice", "disconnected": len(alice)}, got
        for ws in alice:
            with pytest.raises(ConnectionClosed) as e:
                ws.recv(timeout=5 * SLOW)
            assert (e.value.rcvd.code, e.value.rcvd.reason) == (4008, "bye")
        assert ask(bob, op="limits")["ok"] == "limits"
        assert api(served, "/disconnect", {"user": "alice"})[1]["disconnected"] == 0
        # the defaults: 4000 "disconnected"
        again = stack.enter_context(connect(ws_url(served, "alice")))
        assert api(served, "/disconnect", {"user": "alice"})[1]["disconnected"] == 1
        with pytest.raises(ConnectionClosed) as e:
            again.recv(timeout=5 * SLOW)
        assert (e.value.rcvd.code, e.value.rcvd.reason) == (4000, "disconnected")


def test_unsubscribe_a_user_on_every_thread(served):
    with contextlib.ExitStack() as stack:
        alice = open_on_every_thread(served, stack, "alice")
        bob = stack.enter_context(connect(ws_url(served, "bob")))
        for ws in alice + [bob]:
            assert ask(ws, op="subscribe", topic="room")["ok"] == "subscribe"
        assert ask(alice[0], op="subscribe", topic="other")["ok"] == "subscribe"
        status, got = api(served, "/unsubscribe", {"user": "alice", "topic": "room"})
        assert status == 200, got
        assert got == {"user": "alice", "topic": "room", "unsubscribed": len(alice)}
        for ws in alice:   # told with an event, not an ack
            assert json.loads(ws.recv(timeout=5 * SLOW)) == {"event": "unsubscribed",
                                                              "topic": "room"}
            assert ask(ws, op="unsubscribe", topic="room")["error"] == "not subscribed"
        assert ask(alice[0], op="unsubscribe", topic="other")["ok"] == "unsubscribe"
        assert api(served, "/publish", {"topics": ["room"], "data": "x"})[1]["results"] == [
            {"topic": "room", "seq": 1, "subscribers": 1}]
        assert json.loads(bob.recv(timeout=5 * SLOW))["data"] == "x"
        assert api(served, "/unsubscribe", {"user": "alice", "topic": "room"})[1][
            "unsubscribed"] == 0


@pytest.mark.parametrize("path,body,why", [
    ("/disconnect", {}, "missing user"),
    ("/disconnect", {"user": ""}, "user is empty"),
    ("/disconnect", {"user": 5}, "user: a string expected"),
    ("/disconnect", {"user": "u" * 257}, "user too long (256 bytes at most)"),
    ("/disconnect", {"user": "a", "code": 1001}, "code: 1000, or 3000 to 4999 expected"),
    ("/disconnect", {"user": "a", "code": 5000}, "code: 1000, or 3000 to 4999 expected"),
    ("/disconnect", {"user": "a", "reason": "r" * 124},
     "reason: a string of 123 bytes at most expected"),
    ("/disconnect", {"user": "a", "topic": "t"}, "unknown field topic"),
    ("/unsubscribe", {"user": "a"}, "missing topic"),
    ("/unsubscribe", {"topic": "t"}, "missing user"),
    ("/unsubscribe", {"user": "a", "topic": "t" * 257}, "topic too long (256 bytes at most)"),
    ("/unsubscribe", {"user": "a", "topic": "t", "code": 4000}, "unknown field code"),
])
def test_user_call_errors(served, path, body, why):
    assert bad(served, path, body) == why
