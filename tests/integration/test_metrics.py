"""GET /metrics on the admin listener (issue #27): Prometheus' text format,
every /stats counter summed and per thread, refusals by reason, Redis's
link; parsed by prometheus_client's own parser and by a strict reading of
the format's lines."""
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

import pytest

from conftest import SLOW, TERN_BIN

# A sample line of the text format 0.0.4: name, optional labels, a value.
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? -?[0-9]+(\.[0-9]+)?$')


def scrape(t):
    with urllib.request.urlopen(f"{t.admin_base}/metrics", timeout=5 * SLOW) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    assert text.endswith("\n")
    typed = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in typed, f"{name} typed twice"
            typed.add(name)
            continue
        assert SAMPLE.match(line), f"not a sample line: {line!r}"
        name = line.split("{")[0].split(" ")[0]
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"sample before its TYPE: {line!r}"
    values = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def get(values, name, **labels):
    return values[(name, tuple(sorted(labels.items())))]


def test_metrics_parse_and_move_with_traffic(tern):
    before = scrape(tern)
    assert get(before, "tern_threads") == 1
    assert get(before, "tern_bridge_configured") == 0
    assert get(before, "tern_redis_configured") == 0   # deprecated, kept for one release
    for _ in range(3):
        urllib.request.urlopen(f"{tern.base}/ping", timeout=5 * SLOW).read()
    with connect(f"ws://127.0.0.1:{tern.port}/ws") as ws:
        ws.send("hello")
        assert ws.recv(timeout=5 * SLOW) == "hello"
        during = scrape(tern)
        assert get(during, "tern_connections_open") >= 1
        assert get(during, "tern_ws_messages_in_total") >= get(before, "tern_ws_messages_in_total") + 1
    after = scrape(tern)
    assert get(after, "tern_http_requests_total") >= get(before, "tern_http_requests_total") + 4
    assert get(after, "tern_connections_accepted_total") >= get(before, "tern_connections_accepted_total") + 4
    assert get(after, "tern_bytes_out_total") > get(before, "tern_bytes_out_total")
    for reason in ("max_connections", "max_connections_per_ip", "pubsub_rate",
                   "pubsub_rate_closed", "pubsub_too_big"):
        assert get(after, "tern_refused_total", reason=reason) == 0


def test_per_thread_values_add_up_to_the_total(tern_factory):
    t = tern_factory("--threads", "2")
    for _ in range(20):
        urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW).read()
    v = scrape(t)
    assert get(v, "tern_threads") == 2
    for name in ("http_requests_total", "connections_accepted_total", "bytes_in_total",
                 "pubsub_delivered_total"):
        each = [get(v, f"tern_thread_{name}", thread=str(i)) for i in range(2)]
        assert sum(each) == get(v, f"tern_{name}"), name


def test_refusals_are_counted_by_reason(tern_factory):
    t = tern_factory("--max-connections-per-ip", "1")
    with connect(f"ws://127.0.0.1:{t.port}/ws"):
        try:
            urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW)
            raise AssertionError("a second connection was let in")
        except urllib.error.HTTPError as e:
            assert e.code == 503
    v = scrape(t)
    assert get(v, "tern_refused_total", reason="max_connections_per_ip") == 1
    assert get(v, "tern_refused_total", reason="max_connections") == 0
    # the limit's 503, written at the accept, is a response by its code too
    assert get(v, "tern_http_responses_total", code="503") == 1


def test_connection_limit_refusals_are_logged_once_a_second_with_a_count(tern_factory):
    # Issue #37: a refusal by a connection limit is said in the log, but a
    # flood is one line a second counting them, not a line each.
    t = tern_factory("--max-connections-per-ip", "1")
    lines = t.lines()
    started = time.monotonic()
    with connect(f"ws://127.0.0.1:{t.port}/ws"):
        for _ in range(20):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW)
            assert e.value.code == 503
        first = lines.wait(r"connection\(s\) refused")   # the first at once
        assert re.search(r"\b1 connection\(s\) refused.* 0 over max_connections, 1 over "
                         r"max_connections_per_ip", first), first
        time.sleep(1.1)   # a later second: the next refusal writes the others' count
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW)
        lines.wait(r"connection\(s\) refused")
        elapsed = time.monotonic() - started
    time.sleep(0.3)
    said = [re.search(r"\b(\d+) connection\(s\) refused.* (\d+) over max_connections_per_ip",
                      line) for line in t._err.text().splitlines() if "connection(s) refused" in line]
    assert all(said), said
    # every refusal counted once, in at most a line a second
    assert sum(int(m.group(1)) for m in said) == 21, [m.group(0) for m in said]
    assert sum(int(m.group(2)) for m in said) == 21
    assert 2 <= len(said) <= int(elapsed) + 2, [m.group(0) for m in said]


def test_responses_by_status_code(tern):
    # Issue #37: tern_http_responses_total{code}, counted where responses
    # are written (each loop its own array, summed at the scrape).
    before = scrape(tern)
    for _ in range(3):
        urllib.request.urlopen(f"{tern.base}/ping", timeout=5 * SLOW).read()
    for _ in range(2):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{tern.base}/no-such-page", timeout=5 * SLOW)
        assert e.value.code == 404
    after = scrape(tern)
    was = lambda code: before.get(("tern_http_responses_total", (("code", code),)), 0)  # noqa: E731
    assert get(after, "tern_http_responses_total", code="200") == was("200") + 3
    assert get(after, "tern_http_responses_total", code="404") == was("404") + 2


def test_responses_by_code_summed_over_threads(tern_factory):
    # A parser's refusal (400) counts too, and every thread's responses.
    t = tern_factory("--threads", "2")
    with socket.create_connection(("127.0.0.1", t.port), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    for _ in range(10):
        urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW).read()
    v = scrape(t)
    assert get(v, "tern_http_responses_total", code="200") == 10
    assert get(v, "tern_http_responses_total", code="400") == 1


def test_process_metrics_and_build_info(tern_factory):
    # Issue #37: the standard process families a Prometheus user expects,
    # and tern_build_info naming the version, TLS library, back end, node.
    started = time.time()
    t = tern_factory("--node-name", "metrics-node")
    for _ in range(200):   # some CPU to count
        urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW).read()
    v = scrape(t)
    assert get(v, "process_cpu_seconds_total") > 0
    assert abs(get(v, "process_start_time_seconds") - started) < 3 * SLOW
    with open(f"/proc/{t.proc.pid}/limits") as f:
        soft = next(int(line.split()[3]) for line in f if line.startswith("Max open files"))
    assert get(v, "process_max_fds") == soft
    info = [k for k in v if k[0] == "tern_build_info"]
    assert len(info) == 1, info
    labels = dict(info[0][1])
    assert v[info[0]] == 1
    assert labels["node"] == "metrics-node"
    assert labels["version"] == subprocess.run([TERN_BIN, "--version"], capture_output=True,
                                               text=True).stdout.splitlines()[0].split()[-1]
    assert labels["backend"] in ("epoll", "io_uring")
    helped = subprocess.run([TERN_BIN, "serve", "--help"], capture_output=True, text=True).stdout
    assert f"(TLS: {labels['tls']})" in helped.splitlines()[0], labels
    cpu = get(v, "process_cpu_seconds_total")
    for _ in range(200):
        urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW).read()
    assert get(scrape(t), "process_cpu_seconds_total") >= cpu


def test_metrics_are_not_on_the_public_port(tern):
    try:
        urllib.request.urlopen(f"{tern.base}/metrics", timeout=5 * SLOW)
        raise AssertionError("/metrics answered on the public port")
    except urllib.error.HTTPError as e:
        assert e.code == 404


def test_pubsub_counters_move_with_a_publish(tern_factory):
    t = tern_factory("--feed", "off")
    before = scrape(t)
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as a, \
            connect(f"ws://127.0.0.1:{t.port}/pubsub") as b:
        for ws in (a, b):
            ws.send(json.dumps({"op": "subscribe", "topic": "m"}))
            assert json.loads(ws.recv(timeout=5 * SLOW))["ok"] == "subscribe"
        assert get(scrape(t), "tern_pubsub_subscriptions") == 2
        assert t.publish("m", "hello")["subscribers"] == 2
        for ws in (a, b):
            assert json.loads(ws.recv(timeout=5 * SLOW))["data"] == "hello"
        after = scrape(t)
    assert get(after, "tern_pubsub_messages_total") == get(before, "tern_pubsub_messages_total") + 1
    assert get(after, "tern_pubsub_delivered_total") == get(before, "tern_pubsub_delivered_total") + 2
    assert get(after, "tern_thread_pubsub_delivered_total", thread="0") == \
        get(after, "tern_pubsub_delivered_total")
    assert get(after, "tern_pubsub_dropped_total") == 0


def test_pubsub_counters_by_topic_rule(tern_factory):
    """One series per --topic rule, labelled with its pattern: subscribers,
    publishes, copies delivered, history replayed, and resumes with and
    without a gap, each moving for its own rule's topics only."""
    t = tern_factory("--feed", "off", "--topic", "news.* subscribe=anyone publish=anyone history=3",
                     "--topic", "chat subscribe=anyone publish=anyone")

    def rule(v, name, pattern, **labels):
        return get(v, name, rule=pattern, **labels)

    def sub(ws, topic, **resume):
        ws.send(json.dumps({"op": "subscribe", "topic": topic, **resume}))
        replayed = 0
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if m.get("ok") == "subscribe":
                m["replayed_here"] = replayed
                return m
            replayed += 1

    before = scrape(t)
    assert rule(before, "tern_pubsub_rule_subscriptions", "news.*") == 0
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as a, \
            connect(f"ws://127.0.0.1:{t.port}/pubsub") as b:
        epoch = sub(a, "news.eu")["epoch"]
        sub(b, "news.eu")
        sub(b, "chat")
        for i in range(5):
            t.publish("news.eu", f"n{i}")
        for _ in range(5):
            json.loads(a.recv(timeout=5 * SLOW))
            json.loads(b.recv(timeout=5 * SLOW))
        v = scrape(t)
        assert rule(v, "tern_pubsub_rule_subscriptions", "news.*") == 2
        assert rule(v, "tern_pubsub_rule_subscriptions", "chat") == 1
        assert rule(v, "tern_pubsub_rule_published_total", "news.*") == 5
        assert rule(v, "tern_pubsub_rule_delivered_total", "news.*") == 10
        assert rule(v, "tern_pubsub_rule_published_total", "chat") == 0
        assert rule(v, "tern_pubsub_rule_delivered_total", "chat") == 0
    # Resumes: after seq 3 (2 missed, within the history of 3), and after
    # seq 1 (3 missed, one of them gone: a gap).
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as c:
        ack = sub(c, "news.eu", epoch=epoch, after="3")
        assert ack["resumed"] is True and ack["replayed_here"] == 2
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as c:
        ack = sub(c, "news.eu", epoch=epoch, after="1")
        # a gap: the latest message of each key (here one, keyless) instead
        assert ack["resumed"] is False and ack["replayed_here"] == 1
    after = scrape(t)
    assert rule(after, "tern_pubsub_rule_subscriptions", "news.*") == 0
    assert rule(after, "tern_pubsub_rule_resumes_total", "news.*", gap="false") == 1
    assert rule(after, "tern_pubsub_rule_resumes_total", "news.*", gap="true") == 1
    assert rule(after, "tern_pubsub_rule_replayed_total", "news.*") == 2 + 1
    assert rule(after, "tern_pubsub_rule_delivered_total", "news.*") == 10 + 2 + 1
    assert rule(after, "tern_pubsub_rule_resumes_total", "chat", gap="false") == 0
    assert rule(after, "tern_pubsub_rule_dropped_total", "news.*") == 0
    assert rule(after, "tern_pubsub_rule_conflated_total", "news.*") == 0


def test_publish_to_delivery_latency_histogram(tern_factory):
    """A histogram Prometheus takes: cumulative buckets ending in +Inf, a
    _count that is the +Inf bucket, one observation per message and loop
    that had subscribers."""
    t = tern_factory("--feed", "off", "--threads", "2")
    name = "tern_pubsub_delivery_latency_seconds"
    before = scrape(t)
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as a:
        a.send(json.dumps({"op": "subscribe", "topic": "lat"}))
        assert json.loads(a.recv(timeout=5 * SLOW))["ok"] == "subscribe"
        for i in range(7):
            t.publish("lat", f"m{i}")
        for _ in range(7):
            json.loads(a.recv(timeout=5 * SLOW))
        after = scrape(t)
    assert get(after, name + "_count") == get(before, name + "_count") + 7
    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in after.items()
                      if k[0] == name + "_bucket"), key=lambda x: x[0])
    assert buckets[-1] == (float("inf"), get(after, name + "_count"))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)   # cumulative
    assert 0 < get(after, name + "_sum") < 7 * 5 * SLOW
    # every bucket counts, and 7 local hand-offs take under a second each
    assert get(after, name + "_bucket", le="1.000000") == get(after, name + "_count")


def test_websocket_session_length_histogram(tern_factory):
    """Each WebSocket session that ends is one observation of its length:
    a short one in the first bucket, one held open 0.7 s above 0.5 s."""
    import time
    t = tern_factory("--threads", "2")
    name = "tern_ws_session_seconds"
    before = scrape(t)
    with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
        ws.send("a")
        assert ws.recv(timeout=5 * SLOW) == "a"
    with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
        time.sleep(0.7)
        ws.send("b")
        assert ws.recv(timeout=5 * SLOW) == "b"
    deadline = time.monotonic() + 5 * SLOW
    while get(scrape(t), name + "_count") < get(before, name + "_count") + 2:
        assert time.monotonic() < deadline, "the sessions' ends were not counted"
        time.sleep(0.05)
    after = scrape(t)
    assert get(after, name + "_count") == get(before, name + "_count") + 2
    assert get(after, name + "_bucket", le="+Inf") == get(after, name + "_count")
    under = get(after, name + "_bucket", le="0.500000") - get(before, name + "_bucket", le="0.500000")
    assert under == 1   # the short one
    assert get(after, name + "_bucket", le="5.000000") - get(before, name + "_bucket", le="5.000000") == 2
    assert 0.6 <= get(after, name + "_sum") - get(before, name + "_sum") < 5 * SLOW
