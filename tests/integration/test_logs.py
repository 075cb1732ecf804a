"""tern serve's log lines (issue #27): --log-format text|json, every line
with an RFC 3339 timestamp and a level, the access log too."""
import datetime
import json
import os
import re
import socket
import subprocess
import time
import urllib.request

from conftest import SLOW, TERN_BIN
from websockets.sync.client import connect

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LEVELS = {"error", "warn", "info", "debug"}


def recent(ts):
    """ts is an RFC 3339 time within the last minute."""
    assert TS.match(ts), ts
    t = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    age = (datetime.datetime.now(datetime.timezone.utc) - t).total_seconds()
    assert -5 < age < 60, ts
    return True


def lines_of(path, n, timeout=5.0):
    deadline = time.time() + timeout * SLOW
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if len(lines) >= n:
                return lines
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} lines in {path}")


def traffic(t):
    urllib.request.urlopen(f"{t.base}/ping", timeout=5 * SLOW).read()
    urllib.request.urlopen(f"{t.base}/ping?token=s3cr3t", timeout=5 * SLOW).read()
    with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
        ws.send("hi")
        ws.recv(timeout=5 * SLOW)


def test_text_lines_have_a_timestamp_and_a_level(tern_factory, tmp_path):
    log = str(tmp_path / "access.log")
    t = tern_factory("--log-level", "debug", "--access-log", log)
    traffic(t)
    access = lines_of(log, 2)
    assert t.stop() == 0
    err = [l for l in t.stderr.splitlines() if l]
    assert err, "no log lines at debug level"
    for line in err:
        m = re.match(r"^(\S+) tern: \[(\w+)\] ", line)
        assert m and recent(m.group(1)) and m.group(2) in LEVELS, line
    for line in access:
        assert recent(line.split(" ")[0]), line
    assert "s3cr3t" not in "".join(access)


def test_json_lines_parse_and_name_their_fields(tern_factory, tmp_path):
    log = str(tmp_path / "access.log")
    t = tern_factory("--log-format", "json", "--log-level", "debug", "--access-log", log)
    traffic(t)
    access = [json.loads(l) for l in lines_of(log, 2)]
    assert t.stop() == 0
    err = [json.loads(l) for l in t.stderr.splitlines() if l]
    assert err
    for rec in err:
        assert recent(rec["ts"]) and rec["level"] in LEVELS and isinstance(rec["msg"], str), rec
    for rec in access:
        assert recent(rec["ts"]) and rec["level"] == "info" and rec["type"] in ("access", "websocket"), rec
    pings = [r for r in access if r["type"] == "access" and r["target"].startswith("/ping")]
    assert [(r["method"], r["status"], r["bytes"]) for r in pings] == [("GET", 200, 4)] * 2
    assert pings[1]["target"] == "/ping?token=-"
    assert re.match(r"^127\.0\.0\.1:\d+$", pings[0]["peer"])


def test_the_listening_line_is_json_too():
    p = subprocess.Popen([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--admin-listen",
                          "off", "--log-format", "json"], stderr=subprocess.PIPE, text=True)
    try:
        rec = json.loads(p.stderr.readline())
    finally:
        p.terminate()
        p.communicate(timeout=10 * SLOW)
    assert recent(rec["ts"]) and rec["level"] == "info", rec
    assert re.match(r"^listening on http://127\.0\.0\.1:\d+/ \(1 thread, (epoll|io_uring)\)$", rec["msg"]), rec
    assert p.returncode == 0


def test_a_bad_log_format_is_refused():
    r = subprocess.run([TERN_BIN, "serve", "--log-format", "xml"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and "--log-format" in r.stderr


def test_websocket_sessions_close_codes_and_sides(tern_factory, tmp_path):
    """The server's close (a deadline: 1008), and a client that drops the
    connection without a close frame (1006, no side)."""
    log = str(tmp_path / "access.log")
    t = tern_factory("--log-format", "json", "--access-log", log, "--ws-deadline-ms", "200")
    with connect(f"ws://127.0.0.1:{t.port}/ws") as ws:
        ws.send("x")
        ws.recv(timeout=5 * SLOW)
        deadline = time.time() + 5 * SLOW
        while ws.close_code is None and time.time() < deadline:
            try:
                ws.recv(timeout=0.1)
            except TimeoutError:
                pass
            except Exception:
                break
    s = socket.create_connection(("127.0.0.1", t.port), timeout=5 * SLOW)
    s.sendall(b"GET /ws?token=s3cr3t HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              b"Sec-WebSocket-Version: 13\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 101")
    s.close()
    recs = [json.loads(l) for l in lines_of(log, 2)]
    ws_recs = [r for r in recs if r["type"] == "websocket"]
    assert len(ws_recs) == 2, recs
    by_server, dropped = ws_recs
    assert (by_server["close_code"], by_server["closed_by"]) == (1008, "server"), by_server
    assert by_server["messages_in"] == 1 and by_server["messages_out"] == 1, by_server
    assert by_server["bytes_in"] > 0 and by_server["bytes"] > 0 and by_server["ms"] >= 150, by_server
    assert (dropped["close_code"], dropped["closed_by"]) == (1006, "none"), dropped
    assert dropped["target"] == "/ws?token=-" and dropped["status"] == 101, dropped
    assert "s3cr3t" not in open(log).read()
