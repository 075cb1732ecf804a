"""GET /metrics on the admin listener (issue #27): Prometheus' text format,
every /stats counter summed and per thread, refusals by reason, Redis's
link; parsed by prometheus_client's own parser and by a strict reading of
the format's lines."""
import json
import re
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from conftest import SLOW

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
            assert kind in ("counter", "gauge"), line
            assert name not in typed, f"{name} typed twice"
            typed.add(name)
            continue
        assert SAMPLE.match(line), f"not a sample line: {line!r}"
        assert line.split("{")[0].split(" ")[0] in typed, f"sample before its TYPE: {line!r}"
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
    assert get(before, "tern_redis_configured") == 0
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
