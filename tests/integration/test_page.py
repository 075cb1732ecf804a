"""tern serve's live market page at / and the feeds behind it.

Checked: topic "market" carries well-formed price updates with rising seq,
and nothing with --feed off; topic "stats" ticks about once a second with
the server's numbers; headless Chromium loads / (over http and, with wss,
over https), sees prices change and the statistics update, and saves a
screenshot (its path is printed, and kept under build/test-output/); the
page's count of who watches "market" follows a second page opened and
closed."""
import base64
import json
import os
import re
import socket
import time
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, wait_for
from test_ws_clients import chromium, chromium_devtools  # noqa: F401 (fixture)

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "build", "test-output")


def subscribe(ws, *topics):
    for t in topics:
        ws.send(json.dumps({"op": "subscribe", "topic": t}))
        ack = json.loads(ws.recv(timeout=5 * SLOW))
        assert ack["ok"] == "subscribe" and ack["topic"] == t, ack


def next_of(ws, topic, timeout=5.0):
    while True:
        m = json.loads(ws.recv(timeout=timeout * SLOW))
        if m.get("topic") == topic:
            return m["seq"], json.loads(m["data"])


def test_market_feed_messages(tern_factory):
    t = tern_factory("--feed-rate", "200")
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        subscribe(ws, "market")
        seqs, syms = [], set()
        for _ in range(100):
            seq, d = next_of(ws, "market")
            assert set(d) == {"sym", "px", "chg", "ts"}
            assert d["px"] > 0 and abs(d["chg"]) < 100
            assert abs(d["ts"] / 1000 - time.time()) < 60
            seqs.append(seq)
            syms.add(d["sym"])
        assert seqs == list(range(seqs[0], seqs[0] + 100))   # rising, none missing
        assert len(syms) > 10


def test_snapshot_is_whole_right_after_start(tern_factory):
    # The feed publishes every instrument once as it starts, so a page
    # opened at once shows the whole board, not the few picked so far.
    t = tern_factory("--feed-rate", "40")
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "market", "snapshot": True}))
        keys = set()
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if m.get("ok") == "subscribe":
                break
            assert m["topic"] == "market" and m["key"] == json.loads(m["data"])["sym"], m
            keys.add(m["key"])
        assert m["snapshot"] == len(keys), m
        assert len(keys) == 24, sorted(keys)


def test_feed_off_and_stats(tern_factory):
    t = tern_factory("--feed", "off")
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        subscribe(ws, "market", "stats")
        start = time.monotonic()
        ticks = []
        while len(ticks) < 3:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            assert m["topic"] == "stats", m   # no market data with --feed off
            ticks.append((time.monotonic(), json.loads(m["data"])))
        assert 1.2 < ticks[-1][0] - start < 5 * SLOW   # about one a second
        d = ticks[-1][1]
        assert d["connections"] >= 1 and d["threads"] == 1 and d["uptime"] >= 1
        for k in ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "publishes", "delivered",
                  "dropped"):
            assert isinstance(d[k], int) and d[k] >= 0
        # the stats messages themselves were delivered to this subscriber
        assert any(tk[1]["delivered"] >= 1 for tk in ticks)


def test_stats_and_page_name_their_node(tern_factory):
    # Issue #37: each "stats" message names its node (by default
    # HOSTNAME:PID), and the page carries the name of the node that served
    # it, so it shows that node's figures only.
    t = tern_factory("--feed", "off")
    with urllib.request.urlopen(f"{t.base}/", timeout=5 * SLOW) as r:
        page = r.read().decode()
    m = re.search(r'<meta name="tern-node" content="([^"]*)">', page)
    assert m, "no tern-node meta"
    node = m.group(1)
    assert node == f"{socket.gethostname()}:{t.proc.pid}", node
    assert 'if (node && s.node !== node) return;' in page   # the page filters by it
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        subscribe(ws, "stats")
        assert next_of(ws, "stats")[1]["node"] == node
    assert t.stats()["node"] == node
    named = tern_factory("--feed", "off", "--node-name", "eu-1.a")
    with urllib.request.urlopen(f"{named.base}/market", timeout=5 * SLOW) as r:
        assert '<meta name="tern-node" content="eu-1.a">' in r.read().decode()


def test_page_off(tern_factory):
    # Issue #37: an operator turns the demo page off; the rest serves on.
    t = tern_factory("--page", "off")
    for path in ("/", "/market", "/tern-client.js"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{t.base}{path}", timeout=5 * SLOW)
        assert e.value.code == 404, path
    with urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW) as r:
        assert r.status == 200
    # Issue #40: "market" lists who watches it for the page alone.
    m = market_presence_stats(t)
    assert m == {"error": "presence off", "op": "presence_stats"}, m


def market_presence_stats(srv):
    with connect(f"ws://127.0.0.1:{srv.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "presence_stats", "topic": "market"}))
        return json.loads(ws.recv(timeout=5 * SLOW))


def market_presence(srv, op):
    with connect(f"ws://127.0.0.1:{srv.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "market"}))
        ws.send(json.dumps({"op": op, "topic": "market"}))
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if m.get("op") == op or m.get("ok") == op:
                return m


def test_market_presence_counts_only_for_the_page_unless_a_rule_says_otherwise(tern_factory):
    # Issue #40: with the page, "market" has presence=stats: anyone may
    # count who watches (the asker, here), nobody may list them (users and
    # their tokens' info are not the public's); a --topic rule may say on
    # or off.
    t = tern_factory("--feed", "off")
    m = market_presence_stats(t)
    assert m == {"ok": "presence_stats", "topic": "market", "clients": 0, "users": 0}, m
    m = market_presence(t, "presence_stats")
    assert m == {"ok": "presence_stats", "topic": "market", "clients": 1, "users": 1}, m
    m = market_presence(t, "presence")
    assert m == {"error": "counts only", "op": "presence"}, m
    on = tern_factory("--feed", "off", "--topic", "market presence=on")
    m = market_presence(on, "presence")
    assert m["ok"] == "presence" and m["clients"] == 1 and len(m["presence"]) == 1, m
    off = tern_factory("--feed", "off", "--topic", "market presence=off")
    m = market_presence_stats(off)
    assert m == {"error": "presence off", "op": "presence_stats"}, m
    # --page off: no presence on "market" at all.
    nopage = tern_factory("--feed", "off", "--page", "off")
    assert market_presence_stats(nopage) == {"error": "presence off", "op": "presence_stats"}


def test_bad_feed_options():
    import subprocess
    from conftest import TERN_BIN
    for args in (["--feed", "maybe"], ["--feed-rate", "lots"], ["--page", "maybe"],
                 ["--node-name", "a b"], ["--node-name", 'a"b'], ["--node-name", "x" * 65]):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", *args], capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 2 and "bad value" in r.stderr, (args, r.stderr)


# Reads the page's state: every price shown, the statistics panel, status
# (the page writes the DOM once per animation frame: what is pending is
# painted first, so what is shown agrees with the counts).
STATE_JS = """page.flush(), JSON.stringify({
  prices: [...document.querySelectorAll('#rows td.px')].map(e => e.textContent),
  updates: document.getElementById('p-updates').textContent,
  uptime: document.getElementById('s-uptime').textContent,
  connections: document.getElementById('s-connections').textContent,
  status: document.getElementById('status').textContent,
  resumes: page.resumes, gaps: page.gaps, firstSeq: page.firstSeq, lastSeq: page.lastSeq,
  snapshot: page.snapshot, state: page.client.state,
})"""


def market_seq(srv):
    with connect(f"ws://127.0.0.1:{srv.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "market"}))
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if m.get("ok") == "subscribe":
                return m["seq"]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_page_shows_live_prices(tern_factory, chromium, tmp_path, scheme):  # noqa: F811
    from test_tls import make_cert
    cert, key = make_cert(str(tmp_path), "c", "localhost", "DNS:localhost,IP:127.0.0.1")
    # 50 updates a second: every instrument is published once as the feed
    # starts, so the snapshot is whole at once. (At 400 a second, a page
    # starved of CPU by a busy machine fell thousands of updates behind the
    # server, and its resume after the drop rightly found them gone from a
    # history of 4 096: a gap, not a resume.)
    srv = tern_factory("--feed-rate", "50", "--tls-port", "0", "--tls-cert", cert,
                       "--tls-key", key)
    started = time.monotonic()
    base = srv.base if scheme == "http" else f"https://127.0.0.1:{srv.tls_port}"
    with chromium_devtools(chromium, tmp_path, "--ignore-certificate-errors", "--window-size=1280,900") as dt:
        target, s = dt.open_page()
        dt.call("Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                session=s)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        nav = dt.call("Page.navigate", {"url": f"{base}/"}, session=s)
        assert "errorText" not in nav, nav

        def state():
            r = dt.call("Runtime.evaluate", {"expression": STATE_JS, "returnByValue": True},
                        session=s)
            if "exceptionDetails" in r:
                return None   # the page is not there yet
            return json.loads(r["result"]["value"])

        def wait(cond, what):
            deadline = time.monotonic() + 10 * SLOW
            while time.monotonic() < deadline:
                st = state()
                if st is not None and cond(st):
                    return st
                time.sleep(0.1)
            raise AssertionError(f"page never showed {what}: {state()}")

        # every instrument at once: the subscription's snapshot
        shown = wait(lambda st: len(st["prices"]) == 24, "every instrument")
        assert shown["snapshot"] == 24, shown
        first = wait(lambda st: st["uptime"] != "–", "the statistics")
        assert ("wss://" if scheme == "https" else "ws://") in first["status"]
        assert first["status"].startswith("live")
        time.sleep(1.5)
        later = wait(lambda st: st["uptime"] != first["uptime"], "the statistics update")
        # prices moved: the same symbols show other figures now
        n = min(len(first["prices"]), len(later["prices"]))
        assert first["prices"][:n] != later["prices"][:n]
        assert int(later["updates"]) > int(first["updates"])
        assert int(later["connections"]) >= 1
        # The page's socket drops (closed under it); it reconnects and
        # resumes the market stream: every update shown once, none missed.
        before = state()
        head = market_seq(srv)
        dt.call("Runtime.evaluate", {"expression": "page.client.reconnect()"}, session=s)
        resumed = wait(lambda st: st["resumes"] + st["gaps"] >= 1
                       and st["lastSeq"] > later["lastSeq"] + 20, "the stream after the drop")
        assert resumed["gaps"] == 0, \
            f"a gap: the page was {head - before['lastSeq']} updates behind at the drop {resumed}"
        assert int(resumed["updates"]) == resumed["lastSeq"] - resumed["firstSeq"], resumed
        shot = dt.call("Page.captureScreenshot", {"format": "png"}, session=s)
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
        path = tmp_path / f"market-{scheme}.png"
        path.write_bytes(png)
        os.makedirs(OUT_DIR, exist_ok=True)
        kept = os.path.abspath(os.path.join(OUT_DIR, f"market-{scheme}.png"))
        with open(kept, "wb") as f:
            f.write(png)
        print(f"screenshot: {kept}")
        dt.call("Target.closeTarget", {"targetId": target})


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_page_comes_back_by_itself_after_a_restart(tern_factory, chromium, tmp_path):  # noqa: F811
    """tern serve stopped and started again on the same port under the page:
    the client reconnects within its backoff cap (5 s), reports the gap (a
    new epoch), shows every instrument from the new server's snapshot and
    live prices again, and nothing on the page throws or logs an error."""
    port = free_port()
    srv = tern_factory("--port", str(port), "--feed-rate", "400")
    started = time.monotonic()
    with chromium_devtools(chromium, tmp_path) as dt:
        target, s = dt.open_page()
        dt.call("Runtime.enable", session=s)   # exceptions and console calls become events
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        nav = dt.call("Page.navigate", {"url": f"{srv.base}/"}, session=s)
        assert "errorText" not in nav, nav

        def state():
            r = dt.call("Runtime.evaluate", {"expression": STATE_JS, "returnByValue": True},
                        session=s)
            return None if "exceptionDetails" in r else json.loads(r["result"]["value"])

        def wait(cond, what, limit=10):
            deadline = time.monotonic() + limit * SLOW
            while time.monotonic() < deadline:
                st = state()
                if st is not None and cond(st):
                    return st
                time.sleep(0.05)
            raise AssertionError(f"page never showed {what}: {state()}")

        before = wait(lambda st: len(st["prices"]) == 24 and st["state"] == "open",
                      "every instrument")
        srv.stop()
        wait(lambda st: st["state"] == "reconnecting", "the drop")
        time.sleep(1.0)
        srv = tern_factory("--port", str(port), "--feed-rate", "400")
        back_from = time.monotonic()
        back = wait(lambda st: st["state"] == "open" and st["gaps"] == 1, "the page back",
                    limit=8)
        # within the cap, plus what a start and a connect take
        assert time.monotonic() - back_from < 5 + 2 * SLOW
        live = wait(lambda st: int(st["updates"]) > int(back["updates"]) + 20
                    and st["prices"] != before["prices"], "live prices again")
        assert len(live["prices"]) == 24 and live["status"].startswith("live")
        errors = [e for e in dt.events if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled"
                      and e["params"]["type"] in ("error", "assert"))]
        assert errors == [], errors
        dt.call("Target.closeTarget", {"targetId": target})


def test_page_shows_only_its_own_nodes_statistics(tern_factory, chromium, tmp_path):  # noqa: F811
    # Issue #37: behind Redis "stats" carries every node's figures; the
    # page served by node b shows b's alone (uptime, named node), never a's
    # (started seconds earlier, so its uptime is ahead).
    import shutil
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server missing")
    from engines import Redis, free_port
    redis = Redis(free_port())
    redis.start()
    try:
        url = f"redis://127.0.0.1:{redis.port}"
        tern_factory("--redis", url, "--node-name", "node-a", "--feed", "off")
        time.sleep(4)
        b = tern_factory("--redis", url, "--node-name", "node-b", "--feed", "off")
        b_started = time.monotonic()
        with chromium_devtools(chromium, tmp_path) as dt:
            target, s = dt.open_page()
            nav = dt.call("Page.navigate", {"url": f"{b.base}/"}, session=s)
            assert "errorText" not in nav, nav
            js = ("JSON.stringify({node: document.getElementById('s-node').textContent,"
                  " uptime: document.getElementById('s-uptime').textContent})")
            shown = []
            deadline = time.monotonic() + 4 * SLOW
            while time.monotonic() < deadline:
                r = dt.call("Runtime.evaluate", {"expression": js, "returnByValue": True},
                            session=s)
                if "exceptionDetails" not in r:
                    st = json.loads(r["result"]["value"])
                    if st["uptime"] != "–":
                        shown.append((time.monotonic() - b_started, st))
                time.sleep(0.1)
        assert len(shown) > 10, shown
        for age, st in shown:
            assert st["node"] == "node-b", st
            # b's uptime, never a's (4 s and more ahead)
            assert int(st["uptime"].rstrip("s")) <= age + 1, (age, st)
    finally:
        redis.stop()


# Reads who the page says watches "market" (its panel, as painted).
WATCHING_JS = """JSON.stringify({
  clients: document.getElementById('w-clients').textContent,
  users: document.getElementById('w-users').textContent,
})"""


def test_page_shows_who_is_watching(tern_factory, chromium, tmp_path):  # noqa: F811
    """Issue #40: "market" has presence=stats, and the page asks its counts
    every few seconds: a second page opened raises the first one's count
    of clients, closed lowers it again. Every page is anonymous here: one
    user (the empty sub) however many clients."""
    srv = tern_factory("--feed-rate", "50")
    with chromium_devtools(chromium, tmp_path) as dt:
        def open_page():
            target, s = dt.open_page()
            nav = dt.call("Page.navigate", {"url": f"{srv.base}/"}, session=s)
            assert "errorText" not in nav, nav
            return target, s

        def watching(s):
            r = dt.call("Runtime.evaluate", {"expression": WATCHING_JS,
                                             "returnByValue": True}, session=s)
            return None if "exceptionDetails" in r else json.loads(r["result"]["value"])

        def wait(s, clients, what):
            # The page asks every 2 s: well within the wait.
            deadline = time.monotonic() + 10 * SLOW
            while time.monotonic() < deadline:
                st = watching(s)
                if st == {"clients": str(clients), "users": "1"}:
                    return
                time.sleep(0.1)
            raise AssertionError(f"page never showed {what}: {watching(s)}")

        first, s1 = open_page()
        wait(s1, 1, "itself alone watching")
        second, s2 = open_page()
        wait(s2, 2, "two watching, on the second page")
        wait(s1, 2, "two watching, on the first page")
        dt.call("Target.closeTarget", {"targetId": second})
        wait(s1, 1, "itself alone again once the second page closed")
        # the server says the same when asked on /pubsub
        m = market_presence_stats(srv)
        assert m == {"ok": "presence_stats", "topic": "market", "clients": 1,
                     "users": 1}, m
        dt.call("Target.closeTarget", {"targetId": first})


def test_page_over_h2_carries_its_websocket_on_the_same_connection(tern_factory, chromium,  # noqa: F811
                                                                   tmp_path):
    # RFC 8441: the TLS port offers h2 and extended CONNECT, so Chromium
    # loads the page over h2 and opens its /pubsub WebSocket as a stream
    # of that connection: the access log names one peer (address and
    # port) for both, and the WebSocket's handshake was HTTP/2's (200, not
    # HTTP/1.1's 101).
    from test_tls import make_cert
    cert, key = make_cert(str(tmp_path), "c", "localhost", "DNS:localhost,IP:127.0.0.1")
    access = tmp_path / "access.log"
    srv = tern_factory("--feed-rate", "50", "--tls-port", "0", "--tls-cert", cert,
                       "--tls-key", key, "--access-log", str(access))
    with chromium_devtools(chromium, tmp_path, "--ignore-certificate-errors") as dt:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        dt.call("Network.enable", session=s)
        nav = dt.call("Page.navigate", {"url": f"https://127.0.0.1:{srv.tls_port}/"},
                      session=s)
        assert "errorText" not in nav, nav
        page = dt.wait_event(lambda m: m.get("sessionId") == s and
                             m.get("method") == "Network.responseReceived" and
                             m["params"]["type"] == "Document")
        assert page["params"]["response"]["protocol"] == "h2", page["params"]["response"]
        hs = dt.wait_event(lambda m: m.get("sessionId") == s and
                           m.get("method") == "Network.webSocketHandshakeResponseReceived")
        assert hs["params"]["response"]["status"] == 200, hs["params"]["response"]

        def state():
            r = dt.call("Runtime.evaluate", {"expression": STATE_JS, "returnByValue": True},
                        session=s)
            return None if "exceptionDetails" in r else json.loads(r["result"]["value"])

        deadline = time.monotonic() + 10 * SLOW
        while not ((st := state()) and len(st["prices"]) == 24):
            assert time.monotonic() < deadline, f"the page never went live: {st}"
            time.sleep(0.1)
        # (Chromium may open a spare connection beside the page's, a
        # preconnect: the access log's one peer below is what shows the
        # WebSocket on the page's own connection.)
        total = srv.stats()["total"]
        assert total["pubsub"]["subscriptions"] >= 1, total
        dt.call("Target.closeTarget", {"targetId": target})
        # The WebSocket's entry comes at its end.

        def lines():
            return access.read_text().splitlines() if access.exists() else []
        wait_for(lambda: any(" CONNECT /pubsub 200 " in ln for ln in lines()),
                 "the WebSocket's access log entry")
        peer = {ln.split()[1] for ln in lines()
                if " GET / " in ln or " CONNECT /pubsub 200 " in ln}
        assert len(peer) == 1, lines()
