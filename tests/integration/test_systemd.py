"""tern serve under systemd (issue #27): READY=1 once listening, WATCHDOG=1
at half of WatchdogSec, STOPPING=1 at the drain, over a NOTIFY_SOCKET the
test makes; socket activation (the sockets systemd-socket-activate passes,
by name); and the unit files in packaging/ that systemd accepts."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import SLOW, TERN_BIN

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def notify_socket():
    d = tempfile.mkdtemp(prefix="tern-notify-")
    path = os.path.join(d, "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5 * SLOW)
    return s, path, d


def messages(sock, until, timeout):
    """Datagrams until one contains `until` (a field such as READY=1)."""
    got = []
    deadline = time.time() + timeout * SLOW
    while time.time() < deadline:
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            got.append(sock.recv(4096).decode())
        except socket.timeout:
            break
        if until in got[-1].split("\n"):
            return got
    raise AssertionError(f"no {until} in {got}")


def start(path, watchdog_usec=None):
    env = dict(os.environ, NOTIFY_SOCKET=path)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    if watchdog_usec:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    p = subprocess.Popen([TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--threads",
                          "2", "--admin-listen", "127.0.0.1:0", "--shutdown-spread", "0"],
                         env=env, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
    assert m, line
    return p, int(m.group(1))


def test_ready_after_listening_then_stopping_at_the_drain():
    sock, path, d = notify_socket()
    try:
        p, port = start(path)
        got = messages(sock, "READY=1", 5)
        ready = got[-1].split("\n")
        assert any(l.startswith("STATUS=listening on http://127.0.0.1:") for l in ready), ready
        # READY came once the port answers
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert not any("WATCHDOG=1" in g for g in got), "a watchdog without WatchdogSec"
        p.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in messages(sock, "STOPPING=1", 5)[-1].split("\n")
        assert p.wait(timeout=10 * SLOW) == 0
        err = p.stderr.read()
        assert "Sanitizer" not in err and "runtime error:" not in err, err
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)



def test_sighup_sends_reloading_then_ready():
    """Type=notify-reload: SIGHUP sends RELOADING=1 with MONOTONIC_USEC (the
    monotonic clock, as systemd checks it), then READY=1 once the reload is
    done, with the listening status again."""
    sock, path, d = notify_socket()
    try:
        p, port = start(path)
        messages(sock, "READY=1", 5)
        before = time.clock_gettime(time.CLOCK_MONOTONIC)
        p.send_signal(signal.SIGHUP)
        got = messages(sock, "RELOADING=1", 5)
        fields = got[-1].split("\n")
        usec = [int(f.split("=", 1)[1]) for f in fields if f.startswith("MONOTONIC_USEC=")]
        assert len(usec) == 1, fields
        assert before * 1e6 <= usec[0] <= (before + 5 * SLOW) * 1e6, (before, usec)
        ready = messages(sock, "READY=1", 5)[-1].split("\n")
        assert any(l.startswith("STATUS=listening on http://127.0.0.1:") for l in ready), ready
        socket.create_connection(("127.0.0.1", port), timeout=2).close()   # still serving
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0
        err = p.stderr.read()
        assert "Sanitizer" not in err and "runtime error:" not in err, err
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)

def test_watchdog_at_half_the_period():
    sock, path, d = notify_socket()
    try:
        p, _ = start(path, watchdog_usec=400000)   # WatchdogSec=0.4: a ping every 200 ms
        messages(sock, "READY=1", 5)
        t0 = time.time()
        n = 0
        while n < 4:
            messages(sock, "WATCHDOG=1", 2)
            n += 1
        took = time.time() - t0
        assert 0.5 <= took <= 1.5 * SLOW, took   # 4 pings at 200 ms: about 0.8 s
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0
        err = p.stderr.read()
        assert "Sanitizer" not in err and "runtime error:" not in err, err
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_the_unit_file_is_one_systemd_accepts(tmp_path):
    unit = open(os.path.join(ROOT, "packaging", "tern.service")).read()
    assert re.search(r"^Type=notify$", unit, re.M)
    assert re.search(r"^WatchdogSec=", unit, re.M)
    # verify resolves ExecStart's binary: point it at this build's
    local = unit.replace("/usr/local/bin/tern", os.path.abspath(TERN_BIN))
    (tmp_path / "tern.service").write_text(local)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "tern.service")],
                       capture_output=True, text=True, timeout=60)
    # every complaint names the file and line: "tern.service:36: Unknown key..."
    problems = [l for l in (r.stdout + r.stderr).splitlines() if "tern.service:" in l]
    assert not problems, r.stdout + r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(tmp_path / "tern.service")],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for tern\.service: (\d+\.\d+)", r.stdout + r.stderr)
    if m:   # systemd 252 can judge a unit file offline
        assert float(m.group(1)) <= 3.0, r.stdout


def busy_port():
    """A port some other socket holds: tern binding it would fail."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate missing (Debian's systemd)")
def test_socket_activation_serves_the_inherited_sockets(tmp_path):
    """systemd-socket-activate listens on plain, TLS and admin sockets,
    named http, https and admin (FileDescriptorName=), and starts tern at
    the first connection: tern serves those sockets instead of binding its
    flags' ports (which another socket holds here), each of its two loops
    listening on both public sockets, and says READY=1 with their ports."""
    from engines import free_port
    from test_tls import make_cert
    import ssl
    import urllib.request
    cert, key = make_cert(str(tmp_path), "c", "localhost", "DNS:localhost,IP:127.0.0.1")
    http, https, admin = free_port(), free_port(), free_port()
    held, taken = busy_port()
    sock, path, d = notify_socket()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERN_") or k == "TERN_BIN"}
    p = subprocess.Popen(
        ["systemd-socket-activate", "-l", f"127.0.0.1:{http}", "-l", f"127.0.0.1:{https}",
         "-l", f"127.0.0.1:{admin}", "--fdname=http:https:admin", "-E", f"NOTIFY_SOCKET={path}",
         TERN_BIN, "serve", "--host", "127.0.0.1", "--port", str(taken), "--threads", "2",
         "--tls-port", str(taken), "--tls-cert", cert, "--tls-key", key,
         "--admin-listen", f"127.0.0.1:{taken}", "--shutdown-spread", "0", "--feed", "off"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3 * SLOW)   # its sockets listen before it starts tern
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=10 * SLOW) as r:
            assert r.read() == b"pong"
        ready = messages(sock, "READY=1", 5)[-1]
        assert f"STATUS=listening on http://127.0.0.1:{http}/ and https://127.0.0.1:{https}/" \
            in ready and f"(admin http://127.0.0.1:{admin}/)" in ready, ready
        ctx = ssl.create_default_context(cafile=cert)
        with urllib.request.urlopen(f"https://localhost:{https}/ping", context=ctx,
                                    timeout=5 * SLOW) as r:
            assert r.read() == b"pong"
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5 * SLOW) as r:
            assert r.read() == b"ready\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5 * SLOW) as r:
            text = r.read().decode()
        # each of the 2 loops listens on the 2 public sockets and the
        # /http-stream relays' private Unix socket (serve_stream.c)
        assert re.search(r"^tern_listeners 6$", text, re.M), text[:400]
        for i in range(2):
            assert re.search(rf'^tern_thread_listeners{{thread="{i}"}} 3$', text, re.M)
        p.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in messages(sock, "STOPPING=1", 5)[-1].split("\n")
        assert p.wait(timeout=10 * SLOW) == 0
        err = p.stderr.read()
        assert "Sanitizer" not in err and "runtime error:" not in err, err
    finally:
        if p.poll() is None:
            p.kill()
        held.close()
        sock.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate missing (Debian's systemd)")
def test_an_https_socket_without_certificates_is_refused():
    from engines import free_port
    port = free_port()
    p = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{port}", "--fdname=https",
                          TERN_BIN, "serve", "--port", "0", "--admin-listen", "off"],
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3 * SLOW)
        # The connection only wakes systemd-socket-activate, which then runs
        # tern. tern refuses the socket and exits, closing the listener with
        # the connection still queued: the client sees a reset, during
        # connect() or after it, depending on when it next runs. connect_ex
        # returns that instead of raising it.
        with socket.socket() as s:
            s.settimeout(5 * SLOW)
            s.connect_ex(("127.0.0.1", port))
        assert p.wait(timeout=10 * SLOW) == 1
        assert "systemd passed an https socket: it needs --tls-cert and --tls-key" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_the_socket_unit_is_one_systemd_accepts(tmp_path):
    sock_unit = open(os.path.join(ROOT, "packaging", "tern.socket")).read()
    assert re.search(r"^FileDescriptorName=http$", sock_unit, re.M)
    service = open(os.path.join(ROOT, "packaging", "tern.service")).read()
    (tmp_path / "tern.service").write_text(service.replace("/usr/local/bin/tern",
                                                           os.path.abspath(TERN_BIN)))
    (tmp_path / "tern.socket").write_text(sock_unit)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "tern.socket")],
                       capture_output=True, text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines() if "tern.socket:" in l]
    assert not problems, r.stdout + r.stderr
