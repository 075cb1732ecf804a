"""Who may subscribe and publish on /pubsub (src/app/topic_rules.c): closed
as shipped, opened by --topic rules (exact or prefix, each setting from the
most specific rule that gives it) and by tokens; and the byte budget of
all histories together (--pubsub-history-bytes).

The servers here start without the fixture's open-everything rule
(open_topics=False), as an operator's would. The access tests run over ws
and wss, with websockets' asyncio client (one thread: Python's threaded
client over TLS is not safe, see test_tls)."""
import asyncio
import base64
import hashlib
import hmac
import json
import ssl
import subprocess
import time
import urllib.request

import pytest
from websockets.asyncio.client import connect

from conftest import SLOW, TERN_BIN
from test_tls import certs  # noqa: F401  (the session's certificates)

SECRET = b"rules-secret"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(**rights):
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "t", "exp": int(time.time()) + 3600, "tern": rights}).encode())
    sig = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


@pytest.fixture(params=["ws", "wss"])
def start(request, tern_factory, certs, tmp_path):  # noqa: F811
    """Starts a closed server (plus args); returns it with a connect() for
    the scheme under test."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)

    def run(*args):
        tls = []
        if request.param == "wss":
            cert, key = certs["default"]
            tls = ["--tls-port", "0", "--tls-cert", cert, "--tls-key", key]
        t = tern_factory("--token-hmac-secret-file", str(secret), *tls, *args,
                         open_topics=False)
        if request.param == "wss":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            t.open = lambda q="": connect(f"wss://127.0.0.1:{t.tls_port}/pubsub{q}", ssl=ctx)
        else:
            t.open = lambda q="": connect(f"ws://127.0.0.1:{t.port}/pubsub{q}")
        return t
    return run


async def ask(ws, **msg):
    """Sends msg; the first answer that is not a topic's message."""
    await ws.send(json.dumps(msg))
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
        if "ok" in m or "error" in m:
            return m


def forbidden(m, op):
    return m == {"error": "forbidden", "op": op}


def test_closed_by_default_anonymous_reads_the_feed_only(start):
    t = start()

    async def go():
        async with t.open() as ws:
            assert (await ask(ws, op="subscribe", topic="market"))["ok"] == "subscribe"
            assert (await ask(ws, op="subscribe", topic="stats"))["ok"] == "subscribe"
            assert forbidden(await ask(ws, op="subscribe", topic="orders.user42"), "subscribe")
            assert forbidden(await ask(ws, op="subscribe", topic="marketing"), "subscribe")
            assert forbidden(await ask(ws, op="publish", topic="market", data="x"), "publish")
            assert forbidden(await ask(ws, op="publish", topic="chat", data="x"), "publish")
            # a token opens what its rights say, and the feed stays read-only
            async with t.open("?token=" + token(subscribe=["orders.*"], publish=["*"])) as w2:
                assert (await ask(w2, op="subscribe", topic="orders.user42"))["ok"] == "subscribe"
                assert (await ask(w2, op="publish", topic="chat", data="x"))["ok"] == "publish"
                assert forbidden(await ask(w2, op="publish", topic="market", data="x"),
                                 "publish")
    asyncio.run(go())
    limits = t.stats()["pubsub_limits"]
    assert limits["forbidden_subscribe"] == 2
    assert limits["forbidden_publish"] == 3
    with urllib.request.urlopen(f"{t.admin_base}/metrics", timeout=5 * SLOW) as r:
        metrics = r.read().decode()
    assert 'tern_refused_total{reason="pubsub_forbidden_subscribe"} 2\n' in metrics
    assert 'tern_refused_total{reason="pubsub_forbidden_publish"} 3\n' in metrics


def test_snapshot_poisoning_is_refused(start):
    """The write-up's attack: fake keyed prices published into the feed's
    topic, then replayed to every client that resumes with a gap."""
    t = start("--feed", "on", "--feed-rate", "50")

    async def go():
        async with t.open() as ws:
            for i in range(20):
                m = await ask(ws, op="publish", topic="market", key=f"JUNK{i}",
                              data='{"sym":"ACME","px":0.0001337}')
                assert forbidden(m, "publish")
            await asyncio.sleep(0.3)
            # a resume with a gap: the latest message of each key, then the ack
            await ws.send(json.dumps({"op": "subscribe", "topic": "market",
                                      "epoch": "1", "after": "1"}))
            replayed = []
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
                if m.get("ok") == "subscribe":
                    break
                replayed.append(m)
            assert m["resumed"] is False and m["replayed"] == len(replayed) > 0
            assert not any("JUNK" in json.dumps(r) or "0.0001337" in json.dumps(r)
                           for r in replayed)
    asyncio.run(go())
    # the operator still publishes there, on the admin listener
    assert t.publish("market", "operator's")["seq"] > 0


def test_rules_by_exact_topic_and_prefix(start):
    t = start("--feed", "off",
              "--topic", "chat.* subscribe=anyone publish=anyone",
              "--topic", "chat.admin publish=none",
              "--topic", "news.* subscribe=anyone",
              "--topic", "orders.* publish=none")

    async def go():
        async with t.open() as a, t.open() as b:
            assert (await ask(a, op="subscribe", topic="chat.room"))["ok"] == "subscribe"
            ack = await ask(b, op="publish", topic="chat.room", data="hi")
            assert ack["ok"] == "publish" and ack["seq"] == 1
            got = json.loads(await asyncio.wait_for(a.recv(), 5 * SLOW))
            assert got["topic"] == "chat.room" and got["data"] == "hi"
            # the exact rule wins for its topic, and inherits the rest
            assert forbidden(await ask(b, op="publish", topic="chat.admin", data="x"), "publish")
            assert (await ask(b, op="subscribe", topic="chat.admin"))["ok"] == "subscribe"
            # "chat.*" does not cover "chatter"; news is read-only
            assert forbidden(await ask(b, op="subscribe", topic="chatter"), "subscribe")
            assert (await ask(b, op="subscribe", topic="news.eu"))["ok"] == "subscribe"
            assert forbidden(await ask(b, op="publish", topic="news.eu", data="x"), "publish")
        # none is no one: a token's publish right does not beat it
        tok = token(subscribe=["trades.*"], publish=["orders.*", "trades.*"])
        async with t.open("?token=" + tok) as w:
            assert forbidden(await ask(w, op="publish", topic="orders.eu", data="x"), "publish")
            assert (await ask(w, op="publish", topic="trades.eu", data="x"))["ok"] == "publish"
            assert forbidden(await ask(w, op="subscribe", topic="orders.eu"), "subscribe")
    asyncio.run(go())


@pytest.mark.parametrize("spec,why", [
    ("", "expected a topic"),
    ("a*b subscribe=anyone", "* may only end a pattern"),
    ("x subscribe=everyone", "subscribe= takes anyone, token, user or none"),
    ("x publish", "expected KEY=VALUE"),
    ("x colour=blue", "unknown key"),
    ("x history=0", "history= takes 1 to 65536"),
    ("x policy=linger", "policy= takes"),
    ("x presence=yes", "presence= takes on, stats or off"),
    ("x join-leave=1", "join-leave= takes on or off"),
    ("x throttle=0", "throttle= takes 1 to 1000 milliseconds"),
    ("x throttle=1001", "throttle= takes 1 to 1000 milliseconds"),
    ("y" * 300, "pattern longer than a topic"),
])
def test_bad_topic_rules_are_refused(spec, why):
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--topic", spec],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and f"--topic {spec}: {why}" in r.stderr, r.stderr


def test_a_throttled_topic_sends_a_burst_in_the_next_pass(tern_factory):
    """throttle=1000: a message on a quiet topic goes at once, and the
    ones that follow it within the second wait for the next pass, which
    starts no sooner than a second after the first one did (so, a second
    after t0 at least, whatever the machine's load: the bound that cannot
    fail by slowness). Another topic's are not held."""
    t = tern_factory("--feed", "off", "--topic", "slow.* subscribe=anyone throttle=1000")

    async def go():
        async with connect(f"ws://127.0.0.1:{t.port}/pubsub") as s:
            for topic in ("slow.x", "fast"):
                assert (await ask(s, op="subscribe", topic=topic))["ok"] == "subscribe"
            t0 = time.monotonic()
            for d in ("m1", "m2", "m3"):
                t.publish("slow.x", d)
            got = []
            while len(got) < 3:
                m = json.loads(await asyncio.wait_for(s.recv(), 10 * SLOW))
                got.append((m["data"], time.monotonic() - t0))
            assert [d for d, _ in got] == ["m1", "m2", "m3"]
            assert got[1][1] >= 0.95, got   # held for the throttle
            t.publish("fast", "f")   # unthrottled: no second's wait
            m = json.loads(await asyncio.wait_for(s.recv(), 10 * SLOW))
            assert m["data"] == "f"
    asyncio.run(go())


def test_history_byte_budget_keeps_a_quiet_topics_share(tern_factory):
    """40 KB of history for all topics: a busy topic's oldest messages go,
    a quiet topic keeps its own, and a resume past the budget is told of
    the gap."""
    t = tern_factory("--feed", "off", "--pubsub-history", "1000",
                     "--pubsub-history-bytes", "40000")

    async def go():
        async with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
            for i in range(2):
                assert (await ask(ws, op="publish", topic="quiet", data=f"q{i}"))["seq"] == i + 1
            epochs = {}
            for topic in ("quiet", "busy"):
                async with connect(f"ws://127.0.0.1:{t.port}/pubsub") as s:
                    epochs[topic] = (await ask(s, op="subscribe", topic=topic))["epoch"]
            for i in range(100):   # 100 KB into a 40 KB budget
                m = await ask(ws, op="publish", topic="busy", data=f"{i:04d}" + "x" * 996)
                assert m["seq"] == i + 1

            async def resume(topic, after):
                await ws.send(json.dumps({"op": "subscribe", "topic": topic,
                                          "epoch": epochs[topic], "after": str(after)}))
                got = []
                while True:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
                    if m.get("ok") == "subscribe":
                        return got, m
                    got.append(m)
            got, ack = await resume("quiet", 0)
            assert ack["resumed"] is True and [m["data"] for m in got] == ["q0", "q1"]
            # the busy topic kept what fits its share: fewer than 40, not none
            got, ack = await resume("busy", 90)
            assert ack["resumed"] is True and [m["seq"] for m in got] == list(range(91, 101))
            await ask(ws, op="unsubscribe", topic="busy")
            got, ack = await resume("busy", 20)
            assert ack["resumed"] is False and len(got) == 1 and got[0]["seq"] == 100
    asyncio.run(go())


def test_an_exact_rule_gives_its_settings_to_its_topic_alone(tern_factory):
    """history=3 for "hist" exactly: its publishes are numbered and kept
    with no one listening; "histx" and "his" get the server's (none: seq 0)."""
    t = tern_factory("--feed", "off", "--topic", "hist history=3",
                     "--topic", "hi* history=2")

    async def go():
        async with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
            seqs = [(await ask(ws, op="publish", topic="hist", data=str(i)))["seq"]
                    for i in range(5)]
            assert seqs == [1, 2, 3, 4, 5]
            assert (await ask(ws, op="publish", topic="histx", data="x"))["seq"] == 1  # hi*
            assert (await ask(ws, op="publish", topic="other", data="x"))["seq"] == 0
            # the exact rule's 3, not the prefix's 2: a resume after 2 is whole
            epoch = (await ask(ws, op="subscribe", topic="hist"))["epoch"]
            await ask(ws, op="unsubscribe", topic="hist")
            await ws.send(json.dumps({"op": "subscribe", "topic": "hist", "epoch": epoch,
                                      "after": "2"}))
            got = []
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
                if m.get("ok") == "subscribe":
                    break
                got.append(m["seq"])
            assert m["resumed"] is True and got == [3, 4, 5]
            # "histx" keeps the prefix's 2, not the exact rule's 3
            for i in range(4):
                await ask(ws, op="publish", topic="histx", data=str(i))
            epoch = (await ask(ws, op="subscribe", topic="histx"))["epoch"]
            await ask(ws, op="unsubscribe", topic="histx")
            await ws.send(json.dumps({"op": "subscribe", "topic": "histx", "epoch": epoch,
                                      "after": "2"}))
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))
                if m.get("ok") == "subscribe":
                    break
            assert m["resumed"] is False
    asyncio.run(go())
