"""The examples the reference pages (docs/api/) point at, where
test_examples.py has no test of their own: each runs, answers as its
comment says, and exits 0 on SIGTERM (or by itself)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW
from test_examples import EXAMPLES, free_port, stop


def run(name, *args):
    """Starts examples/NAME with args ("{port}" is a free port) and waits
    until it listens; returns the process and the port."""
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} was not built")
    port = free_port()
    proc = subprocess.Popen([path, *[a.format(port=port) for a in args]],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 5 * SLOW
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    pytest.fail(f"{name} did not listen: {proc.communicate()[1]!r}")


def get(url, host=None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_timers_ends_by_itself():
    out = subprocess.run([os.path.join(EXAMPLES, "timers")], capture_output=True,
                         timeout=10 * SLOW, check=True).stdout.decode()
    assert out.count("tick ") == 3 and "shot 1" in out and "shot 2" in out


def test_errors_names_each_code():
    out = subprocess.run([os.path.join(EXAMPLES, "errors")], capture_output=True,
                         timeout=10 * SLOW, check=True).stdout.decode()
    assert "TERN_ENOHOST" in out and "Host name does not resolve" in out
    assert "EBUSY" in out and "UNKNOWN" in out


def test_logging_access_log_has_each_response():
    proc, port = run("logging", "{port}")
    try:
        assert get(f"http://127.0.0.1:{port}/hello") == (200, b"hello\n")
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        proc.send_signal(15)
        _, err = proc.communicate(timeout=10 * SLOW)
    err = err.decode()
    assert proc.returncode == 0, err
    assert '"GET /hello" 200 6' in err and '"GET /nothing" 404' in err


def test_static_hosts_serves_files_on_its_host_only(tmp_path):
    (tmp_path / "hello.txt").write_bytes(b"a file\n")
    proc, port = run("static_hosts", str(tmp_path), "{port}")
    try:
        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/files/hello.txt", host="docs.localhost") == (200, b"a file\n")
        assert get(f"{base}/nope", host="docs.localhost") == (404, b'{"error":"not found"}\n')
        assert get(f"{base}/files/nope", host="docs.localhost")[0] == 404
        assert get(f"{base}/files/hello.txt")[0] == 404   # the default host has no files
        assert get(f"{base}/") == (200, b"the files are on docs.localhost\n")
    finally:
        stop(proc)


def test_threads_answers_sums_and_stops_from_a_handler():
    proc, port = run("threads", "2", "{port}")
    base = f"http://127.0.0.1:{port}"
    status, body = get(f"{base}/")
    assert status == 200 and body.startswith(b"thread ") and b" of 2 " in body
    status, body = get(f"{base}/stats")
    assert status == 200 and body.startswith(b"requests ")
    req = urllib.request.Request(f"{base}/stop", method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 202
    proc.communicate(timeout=15 * SLOW)
    assert proc.returncode == 0


def test_pubsub_rooms_fan_out_resume_and_refusal():
    proc, port = run("pubsub_rooms", "{port}")
    try:
        url = f"ws://127.0.0.1:{port}/room/lobby"
        with connect(url) as a, connect(url) as b:
            resume_a = a.recv()
            assert resume_a.startswith("resume epoch=")
            b.recv()
            a.send("hi")
            assert b.recv(timeout=5) == '{"seq":1} hi'
            epoch = resume_a.split()[1].split("=")[1]
        with connect(f"{url}?epoch={epoch}&after=0") as c:
            # What it missed comes first (sent by the subscribe), then the
            # line saying where the subscription starts.
            assert c.recv(timeout=5) == '{"seq":1} hi'
            assert "after=1 (nothing missed)" in c.recv(timeout=5)
        with connect(f"ws://127.0.0.1:{port}/room/staff-x") as d:
            with pytest.raises(Exception):
                d.recv(timeout=5)
            assert d.close_code == 4003
    finally:
        stop(proc)


def test_https_over_tls_and_wss():
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost"], check=True,
                       capture_output=True)
        proc, port = run("https", cert, key, "{port}")
        try:
            import ssl
            ctx = ssl.create_default_context(cafile=cert)
            ctx.check_hostname = False
            with urllib.request.urlopen(f"https://localhost:{port}/", context=ctx,
                                        timeout=5) as r:
                assert r.read() == b"tls: yes, sni: localhost\n"
            with connect(f"wss://localhost:{port}/echo", ssl=ctx) as ws:
                ws.send("over tls")
                assert ws.recv(timeout=5) == "over tls"
        finally:
            stop(proc)
