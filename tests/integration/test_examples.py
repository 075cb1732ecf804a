"""The programs in examples/ build against the public headers only and do
what their comments say."""
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(TERN_BIN)), "examples")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} was not built")
    port = free_port()
    proc = subprocess.Popen([path, str(port)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 5 * SLOW
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    pytest.fail(f"{name} did not listen: {proc.communicate()[1]!r}")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10 * SLOW)
    err = err.decode(errors="replace")
    assert "Sanitizer" not in err and "runtime error:" not in err, err
    assert proc.returncode == 0, err


def test_hello_http():
    proc, port = start("hello_http")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello/world", timeout=5) as r:
            assert r.read() == b"hello, world\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as r:
            assert r.read() == b"pong"
    finally:
        stop(proc)


def test_ws_echo_one_line_server():
    proc, port = start("ws_echo")
    try:
        with connect(f"ws://127.0.0.1:{port}/any/path") as ws:
            ws.send("one line")
            assert ws.recv() == "one line"
            ws.send(b"\x00\x01")
            assert ws.recv() == b"\x00\x01"
    finally:
        stop(proc)
