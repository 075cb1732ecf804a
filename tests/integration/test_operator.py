"""What an operator needs of a long-running `tern serve` (issue #37): a
port another process listens on is refused; SIGUSR1 reopens the log files
(logrotate) and SIGUSR2 is ignored; descriptors running out leave the admin
listener answering and are logged once a second, not in a flood."""
import datetime
import os
import re
import resource
import signal
import socket
import subprocess
import time

import pytest

from conftest import SANITIZED, SLOW, TERN_BIN, Server, read_response, wait_for
from test_tls import certs  # noqa: F401  (the fixture)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(*args):
    """Runs a second `tern serve` that must fail at start: its exit code
    and stderr."""
    p = subprocess.run([TERN_BIN, "serve", "--host", "127.0.0.1", "--threads", "2",
                        "--admin-listen", "127.0.0.1:0", *args],
                       capture_output=True, text=True, timeout=20 * SLOW)
    for report in ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer"):
        assert report not in p.stderr, p.stderr
    return p.returncode, p.stderr


def get(port, path="/ping"):
    with socket.create_connection(("127.0.0.1", port), timeout=5 * SLOW) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, body, _ = read_response(s, timeout=5 * SLOW)
        return status, body


# ---- a port in use ----------------------------------------------------------------

def test_a_second_server_on_the_same_port_is_refused():
    # Both with two threads, so both listen with SO_REUSEPORT: without the
    # check the second would start and take half of the first's clients.
    port = free_port()
    first = Server(["--threads", "2", "--port", str(port)])
    try:
        assert first.port == port
        code, err = refused("--port", str(port))
        assert code != 0
        assert f"listen on 127.0.0.1:{port}: Address already in use" in err, err
        # The first still has every connection: 20 in a row all answered.
        for _ in range(20):
            assert get(port) == (200, b"pong")
    finally:
        assert first.stop() == 0, first.stderr


def test_a_second_server_on_the_same_admin_port_is_refused():
    admin = free_port()
    first = Server(["--threads", "2", "--admin-listen", f"127.0.0.1:{admin}"])
    try:
        code, err = refused("--port", "0", "--admin-listen", f"127.0.0.1:{admin}")
        assert code != 0
        assert f"--admin-listen 127.0.0.1:{admin}: Address already in use" in err, err
    finally:
        assert first.stop() == 0, first.stderr


def test_a_second_server_on_the_same_tls_port_is_refused(certs):  # noqa: F811
    cert, key = certs["default"]
    tls_port = free_port()
    first = Server(["--threads", "2", "--tls-port", str(tls_port), "--tls-cert", cert,
                    "--tls-key", key])
    try:
        assert first.tls_port == tls_port
        code, err = refused("--port", "0", "--tls-port", str(tls_port), "--tls-cert", cert,
                            "--tls-key", key)
        assert code != 0
        assert f"listen on 127.0.0.1:{tls_port}: Address already in use" in err, err
    finally:
        assert first.stop() == 0, first.stderr


def unix_listening(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.setblocking(False)
        try:
            s.connect(path)
            return True
        except BlockingIOError:
            return True
        except OSError:
            return False


def test_a_second_server_on_the_same_unix_path_is_refused(tmp_path):
    # The path is not taken from a live server (its file is not removed);
    # a stale file, left by a server killed without its cleanup, is.
    path = str(tmp_path / "tern.sock")
    first = Server(["--unix", path])
    try:
        code, err = refused("--port", "0", "--unix", path)
        assert code != 0
        assert f"listen on {path}: Address already in use" in err, err
        out = subprocess.run(["curl", "-sS", "--unix-socket", path, "http://x/ping"],
                             capture_output=True, text=True, timeout=10 * SLOW)
        assert out.stdout == "pong", out
    finally:
        assert first.stop() == 0, first.stderr
    if not os.path.exists(path):
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)   # a socket file nobody listens on
        stale.close()
    # (Under io_uring the kernel tears the exited process's ring down a
    # moment later, and with it the listening socket.)
    wait_for(lambda: not unix_listening(path), "the first server's socket to go")
    second = Server(["--unix", path])
    try:
        out = subprocess.run(["curl", "-sS", "--unix-socket", path, "http://x/ping"],
                             capture_output=True, text=True, timeout=10 * SLOW)
        assert out.stdout == "pong", out
    finally:
        assert second.stop() == 0, second.stderr


def listeners_on(port):
    """How many sockets listen on 127.0.0.1:port (/proc/net/tcp, state 0A)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                n += 1
    return n


def old_listener_gone(port):
    return listeners_on(port) == 2   # the new server's two threads


def test_reuse_port_hands_the_port_over():
    # A zero-downtime restart: the new process shares the ports, the old
    # one drains and exits, the new one has every connection.
    port, admin = free_port(), free_port()
    args = ["--threads", "2", "--port", str(port), "--admin-listen", f"127.0.0.1:{admin}",
            "--reuse-port"]
    old = Server(args)
    new = None
    try:
        new = Server(args)
        assert new.port == port and new.admin_port == admin
        # Both answer meanwhile, each on its own connections.
        for _ in range(20):
            assert get(port) == (200, b"pong")
        assert old.stop() == 0, old.stderr
        # (Under io_uring the kernel tears the exited process's ring down,
        # and its listening socket with it, a moment later: until then a
        # connection hashed to that socket is reset.)
        wait_for(lambda: old_listener_gone(port), "the old listener to go")
        for _ in range(20):
            assert get(port) == (200, b"pong")
        assert get(admin, "/healthz") == (200, b"ok\n")
    finally:
        old.stop()
        if new:
            assert new.stop() == 0, new.stderr


# ---- log rotation -----------------------------------------------------------------


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_sigusr1_reopens_the_access_log(tmp_path):
    # logrotate's way: the file is renamed, tern is told with SIGUSR1, and
    # the next lines go to a new file under the old name (both threads'),
    # none to the renamed one.
    log, rotated = tmp_path / "access.log", tmp_path / "access.log.1"
    t = Server(["--threads", "2", "--access-log", str(log)])
    try:
        assert get(t.port, "/ping?before") == (200, b"pong")
        wait_for(lambda: any("/ping?before" in l for l in lines(log)), "the first line")
        os.rename(log, rotated)
        t.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: log.exists(), "the new file")
        # Several connections, so that both threads (SO_REUSEPORT) answer.
        n = 0
        while not any("/ping?after" in l for l in lines(log)):
            assert get(t.port, f"/ping?after{n}") == (200, b"pong")
            n += 1
            assert n < 200, lines(rotated)
        for i in range(20):
            assert get(t.port, f"/ping?more{i}") == (200, b"pong")
        wait_for(lambda: sum("/ping?more" in l for l in lines(log)) == 20, "20 lines")
        old = lines(rotated)
        assert any("/ping?before" in l for l in old)
        assert not any("/ping?more" in l for l in old), old
        assert t.proc.poll() is None
    finally:
        assert t.stop() == 0, t.stderr
    assert "SIGUSR1: --access-log" in t.stderr and "reopened" in t.stderr, t.stderr


def test_sigusr2_is_ignored(tern):
    tern.proc.send_signal(signal.SIGUSR2)
    tern.proc.send_signal(signal.SIGUSR1)   # without --access-log: nothing to reopen
    time.sleep(0.3 * SLOW)
    assert tern.proc.poll() is None
    assert get(tern.port) == (200, b"pong")


# ---- descriptors --------------------------------------------------------------------

def admin_get(t, path):
    """A new connection to the admin listener each time: what a probe or a
    scraper does."""
    with socket.create_connection(("127.0.0.1", t.admin_port), timeout=3 * SLOW) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, body, _ = read_response(s, timeout=3 * SLOW)
        return status, body.decode()


@pytest.mark.parametrize("limit", [128, 4800])
def test_out_of_descriptors_the_admin_listener_still_answers(limit):
    """The public listeners stop short of the limit and leave a reserve of
    descriptors: new admin connections are still accepted and answered
    (/readyz says why it is not ready, /metrics counts the paused
    listeners) while clients wait; the back-offs, ten a second per
    listener, are logged once a second with their count. On io_uring a
    listener far below its limit lets the kernel accept ahead (multishot)
    and takes one connection at a time once near it (within its backlog,
    4096, and a margin): the 4800 case crosses from one to the other."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < limit + 200:
        pytest.skip(f"this test's clients need {limit + 200} descriptors (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit + 200), hard))
    t = Server(["--threads", "2", "--head-timeout", "60000"],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
    clients = []
    try:
        assert admin_get(t, "/readyz") == (200, "ready\n")
        for _ in range(limit + 20):
            clients.append(socket.create_connection(("127.0.0.1", t.port), timeout=5 * SLOW))
        wait_for(lambda: admin_get(t, "/readyz")[0] == 503, "/readyz 503")
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            assert admin_get(t, "/readyz") == (
                503, "not ready: a listener is not accepting (out of descriptors)\n")
            status, metrics = admin_get(t, "/metrics")
            assert status == 200
            paused = int(next(line.split()[1] for line in metrics.splitlines()
                              if line.startswith("tern_listeners_paused ")))
            assert paused >= 1
            time.sleep(0.1)
        assert t.open_fds() <= limit
        # Room again: every client still there is served (the parked one
        # first, then those waiting in the accept queue), so none was taken
        # ahead and closed on the way (io_uring's multishot would have).
        half = len(clients) // 2
        for c in clients[:half]:
            c.close()
        for c in clients[half:]:
            c.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        for c in clients[half:]:
            status, _, body, _ = read_response(c, timeout=5 * SLOW)
            assert (status, body) == (200, b"pong")
        for c in clients[half:]:
            c.close()
        clients = []
        wait_for(lambda: admin_get(t, "/readyz") == (200, "ready\n"), "ready again")
    finally:
        for c in clients:
            c.close()
        assert t.stop() == 0, t.stderr
    logged = [l for l in t.stderr.splitlines() if "accept: Too many open files" in l]
    # Three seconds and more out of descriptors: about one line a second
    # (two listeners backing off ten times a second each: sixty lines
    # before), each with the count since the one before.
    assert 2 <= len(logged) <= 8, logged
    assert all(re.search(r"\d+ times? since the last line", l) for l in logged), logged
    stamps = [datetime.datetime.fromisoformat(l.split()[0].replace("Z", "+00:00"))
              for l in logged]
    assert all((b - a).total_seconds() >= 0.9 for a, b in zip(stamps, stamps[1:])), logged


def serve_logged(tmp_path, name, args, preexec_fn=None):
    """A `tern serve` whose stderr goes to a file (a pipe read by lines
    would keep in its buffer the line right after "listening on"): the
    process, its port and the file."""
    log = tmp_path / name
    with open(log, "w") as f:
        p = subprocess.Popen([TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0",
                              "--threads", "1", "--admin-listen", "127.0.0.1:0", *args],
                             stdout=subprocess.DEVNULL, stderr=f, preexec_fn=preexec_fn)
    wait_for(lambda: "listening on" in log.read_text(), "the listening line")
    port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)/", log.read_text()).group(1))
    return p, port, log


def stop_logged(p, log):
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10 * SLOW) == 0
    text = log.read_text()
    for report in ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer"):
        assert report not in text, text
    return text


def test_descriptor_limit_raised_and_checked(tmp_path):
    """The soft limit is raised to the hard one at start; a hard limit too
    low for --max-connections is said once, after the "listening on"
    line."""
    p, port, log = serve_logged(
        tmp_path, "low.log", ["--max-connections", "1000"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512)))
    try:
        with open(f"/proc/{p.pid}/limits") as f:
            row = next(l for l in f if l.startswith("Max open files"))
        assert row.split()[3:5] == ["512", "512"], row
        assert get(port) == (200, b"pong")
    finally:
        text = stop_logged(p, log)
    lines_ = text.splitlines()
    warned = [i for i, l in enumerate(lines_) if "too few for --max-connections 1000" in l]
    assert len(warned) == 1, text
    assert "listening on" in lines_[warned[0] - 1], text
    assert "[warn] descriptors: the limit (RLIMIT_NOFILE, raised to the hard limit) is 512" \
        in lines_[warned[0]]
    # Enough for 100 with the machine's limit: no warning.
    p, port, log = serve_logged(tmp_path, "enough.log", ["--max-connections", "100"])
    try:
        assert get(port) == (200, b"pong")
    finally:
        text = stop_logged(p, log)
    assert "too few for --max-connections" not in text, text
