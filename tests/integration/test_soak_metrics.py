"""A short soak watched through /metrics, scraped every second as
Prometheus would (issue #27): HTTP, WebSocket echo and pub/sub load for a
few seconds, then the load stops; every scrape parses, the counters move
while it runs, and after it no gauge grows: connections, subscriptions and
descriptors are back at their baseline, resident memory stays put."""
import json
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from conftest import SANITIZED, SLOW
from test_metrics import get, scrape

LOAD_SECONDS = 4.0
AFTER_SCRAPES = 3
# Gauges that are high-water marks or settings, not levels: they may stay up.
NOT_LEVELS = {"tern_pubsub_queue_max", "tern_thread_pubsub_queue_max", "tern_threads"}


def gauges(t):
    with urllib.request.urlopen(f"{t.admin_base}/metrics", timeout=5 * SLOW) as r:
        text = r.read().decode()
    return {fam.name for fam in text_string_to_metric_families(text) if fam.type == "gauge"}


def test_no_gauge_grows_after_the_load(tern_factory):
    t = tern_factory("--threads", "2", "--feed", "off", "--topic",
                     "s.* subscribe=anyone publish=anyone")
    names = gauges(t) - NOT_LEVELS
    base = scrape(t)
    stop = threading.Event()
    errors = []
    scrapes = []

    def guarded(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
            except Exception as e:   # reported below, with the others
                errors.append(repr(e))
        return run

    def http_client():
        with urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW) as r:
            assert r.read() == b"pong"

    def ws_client():
        with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
            for i in range(20):
                ws.send(f"m{i}")
                assert ws.recv(timeout=5 * SLOW) == f"m{i}"

    def subscriber(n):
        def run():
            with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
                ws.send(json.dumps({"op": "subscribe", "topic": f"s.{n % 3}"}))
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    try:
                        ws.recv(timeout=0.1)
                    except TimeoutError:
                        pass
        return run

    def publisher():
        with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
            for i in range(50):
                ws.send(json.dumps({"op": "publish", "topic": f"s.{i % 3}", "data": str(i)}))
                assert json.loads(ws.recv(timeout=5 * SLOW)).get("ok") == "publish"

    workers = [threading.Thread(target=guarded(f)) for f in
               [http_client, http_client, ws_client, ws_client, publisher] +
               [subscriber(n) for n in range(4)]]
    for w in workers:
        w.start()
    start = time.monotonic()
    while time.monotonic() - start < LOAD_SECONDS:
        time.sleep(1.0)
        scrapes.append(scrape(t))
    stop.set()
    for w in workers:
        w.join(timeout=10 * SLOW)
    assert not errors, errors[:3]
    during = scrapes[-1]
    assert get(during, "tern_http_requests_total") > get(base, "tern_http_requests_total") + 20
    assert get(during, "tern_pubsub_rule_published_total", rule="s.*") > 20
    assert get(during, "tern_pubsub_rule_delivered_total", rule="s.*") > 0
    assert max(get(s, "tern_connections_open") for s in scrapes) > get(base, "tern_connections_open")

    # The closes the clients began are the server's to finish: a moment.
    deadline = time.monotonic() + 5 * SLOW
    while get(scrape(t), "tern_connections_open") != get(base, "tern_connections_open"):
        assert time.monotonic() < deadline, "connections stayed open after the load"
        time.sleep(0.05)
    after = []
    for _ in range(AFTER_SCRAPES):
        after.append(scrape(t))
        time.sleep(1.0)
    for key in after[0]:
        if key[0] not in names:
            continue
        first, last = after[0][key], after[-1][key]
        slack = (2 << 20) if key[0] == "process_resident_memory_bytes" else 0
        assert last <= first + slack, f"{key} grew after the load: {first} -> {last}"
    level = after[-1]
    for name, labels in [("tern_connections_open", {}), ("tern_pubsub_subscriptions", {}),
                         ("tern_pubsub_rule_subscriptions", {"rule": "s.*"}),
                         ("tern_listeners_paused", {}), ("process_open_fds", {})]:
        assert get(level, name, **labels) == get(base, name, **labels), name
    assert get(level, "tern_pubsub_rule_subscriptions", rule="s.*") == 0
    if not SANITIZED:   # ASan's quarantine holds freed memory on purpose
        assert get(level, "process_resident_memory_bytes") < \
            get(base, "process_resident_memory_bytes") + (64 << 20)
