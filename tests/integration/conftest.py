"""Fixtures that run a real `tern serve` on 127.0.0.1 and stop it cleanly.

TERN_BIN names the binary (make sets it). Every server is started on port 0
and the port is read from its first log line. At teardown the server gets
SIGTERM and must exit 0 within a few seconds, without a sanitizer report.
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

TERN_BIN = os.environ.get("TERN_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tern")
SANITIZED = os.environ.get("TERN_SANITIZED") == "1"
# Timing allowances grow under the sanitizers, which slow everything down.
SLOW = 3.0 if SANITIZED else 1.0


def tls_library():
    """The build's TLS library ("OpenSSL 3.0.x", "rustls-ffi/..."), as the
    first line of `tern serve --help` names it: some options are OpenSSL's
    only, and a rustls build refuses them at start."""
    global _tls_library
    if _tls_library is None:
        first = subprocess.run([TERN_BIN, "serve", "--help"], capture_output=True, text=True,
                               timeout=10).stdout.split("\n", 1)[0]
        _tls_library = re.search(r"\(TLS: (.*)\)", first).group(1)
    return _tls_library


_tls_library = None


def has_flag(args, flag):
    return any(a == flag or a.startswith(flag + "=") for a in args)


class Server:
    """bench_routes: start with --bench-routes (the routes most tests use:
    /echo, /ws, /fanout...). Unless the test gives its own, the admin
    listener is on a free port (admin_port, admin_base) and POST /publish
    there takes api_key (written to a file of its own, --api-key-file).
    open_topics: every topic but the feed's open to anyone on /pubsub
    (--topic '* subscribe=anyone publish=anyone'), as most pub/sub tests
    need; test_topic_rules starts servers without it, closed as shipped."""

    def __init__(self, args, cwd=None, preexec_fn=None, bench_routes=True, api_key=True,
                 open_topics=True):
        self.args = args
        self.api_key = None
        self._key_dir = None
        extra = []
        if bench_routes and "--bench-routes" not in args:
            extra.append("--bench-routes")
        if open_topics:
            extra += ["--topic", "* subscribe=anyone publish=anyone"]
        if not has_flag(args, "--admin-listen"):
            extra += ["--admin-listen", "127.0.0.1:0"]
        if api_key and not has_flag(args, "--api-key-file"):
            self._key_dir = tempfile.mkdtemp(prefix="tern-key-")
            self.api_key = "k-" + secrets.token_hex(16)
            path = os.path.join(self._key_dir, "api-key")
            with open(path, "w") as f:
                f.write(self.api_key + "\n")
            extra += ["--api-key-file", path]
        # One loop unless the test asks for more: many tests measure one
        # loop (RSS, descriptors, broadcast order, connection numbers).
        threads = [] if any(a == "--threads" or a.startswith("--threads=") for a in args) \
            else ["--threads", "1"]
        # Every test client connects from 127.0.0.x, many of them far more
        # times than the per-address default (50) and some more than the
        # total (10000: test_faults opens 18 000); /pubsub tests publish
        # bursts of thousands and messages of megabytes. So the per-client
        # limits are off (as they were before they existed) unless the
        # test sets one itself (test_limits).
        off = {"--max-connections": "0", "--max-connections-per-ip": "0",
               "--pubsub-rate": "0", "--pubsub-max-message": str(16 << 20)}
        # A test's stop closes its WebSockets at once, not spread over
        # seconds (test_drain sets the spread it measures).
        off["--shutdown-spread"] = "0"
        limits = [x for flag, value in off.items()
                  if not any(a == flag or a.startswith(flag + "=") for a in args)
                  for x in (flag, value)]
        self.proc = subprocess.Popen(
            [TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0", *threads, *limits, *extra,
             *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, preexec_fn=preexec_fn)
        line = self.proc.stderr.readline().decode()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise RuntimeError(f"tern did not start: {line!r} {err.decode()!r}")
        self.port = int(m.group(1))
        m = re.search(r"https://127\.0\.0\.1:(\d+)/", line)
        self.tls_port = int(m.group(1)) if m else None
        m = re.search(r"\(admin http://(?:127\.0\.0\.1|\[[0-9a-f:]+\]):(\d+)/\)", line)
        self.admin_port = int(m.group(1)) if m else None
        self.admin_base = f"http://127.0.0.1:{self.admin_port}" if m else None
        self.host = "127.0.0.1"
        self.base = f"http://127.0.0.1:{self.port}"
        self.stderr = ""
        # Both pipes are read to their end from now on, whatever the test
        # does: a server that logs a lot (a SIGHUP storm logs a line per
        # reload) would otherwise fill a 64 KiB pipe nobody reads and block
        # in write(2), stopping its loop, so handshakes time out and timers
        # fire late, on a slow machine sooner than on a fast one.
        self._err = Output(self.proc.stderr, first=line.encode())
        self._out = Output(self.proc.stdout)

    def lines(self):
        """The server's stderr from after its "listening on" line: wait()
        returns the next line matching a pattern."""
        return Lines(self._err, start=1)

    def connect(self, timeout=5.0):
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        return s

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def open_fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def admin_connect(self, timeout=5.0):
        return socket.create_connection((self.host, self.admin_port), timeout=timeout)

    def stats(self, timeout=5.0):
        """GET /stats on the admin listener, as JSON."""
        with urllib.request.urlopen(f"{self.admin_base}/stats", timeout=timeout * SLOW) as r:
            return json.loads(r.read())

    def publish(self, topic, body, timeout=5.0):
        """POST /publish/topic on the admin listener with the key: its JSON answer."""
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(f"{self.admin_base}/publish/{topic}", data=body,
                                     method="POST",
                                     headers={"Authorization": f"Bearer {self.api_key}"})
        with urllib.request.urlopen(req, timeout=timeout * SLOW) as r:
            return json.loads(r.read())

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Signals the server and returns its exit code; fails on a sanitizer report."""
        if self._key_dir:
            shutil.rmtree(self._key_dir, ignore_errors=True)
            self._key_dir = None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._out.finish()
            self._err.finish()
            raise AssertionError("tern did not exit after SIGTERM: " + self._err.text())
        self._out.finish()
        self._err.finish()
        self.stderr = self._err.text()
        assert "ERROR: AddressSanitizer" not in self.stderr, self.stderr
        assert "runtime error:" not in self.stderr, self.stderr
        assert "LeakSanitizer" not in self.stderr, self.stderr
        return self.proc.returncode


class Output:
    """One of a server's pipes, read line by line to its end by a thread of
    its own, kept whole (tests look at what was logged after the fact)."""

    def __init__(self, f, first=b""):
        self.f = f
        self.got = [first] if first else []
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in iter(self.f.readline, b""):
            with self.cv:
                self.got.append(line)
                self.cv.notify_all()

    def finish(self, timeout=10.0):
        """After the process exited: the rest of the pipe (a child that
        inherited it could hold it open: then what came so far)."""
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.f.close()

    def text(self):
        with self.cv:
            return b"".join(self.got).decode(errors="replace")


def go_build(tmp_path_factory, package, name):
    """Builds package (".", "./server", ...) of the Go test clients'
    module, tests/clients/go, into a fresh temporary folder as name, and
    returns its path; skips the test when go is not installed."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed")
    exe = tmp_path_factory.mktemp("go-" + name) / name
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local"}
    clients = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "go")
    r = subprocess.run([go, "build", "-o", str(exe), package], cwd=clients, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"go build failed:\n{r.stdout}\n{r.stderr}"
    return str(exe)


def wait_for(cond, what, timeout=10.0):
    """Polls cond until it holds; fails naming what after timeout seconds
    (times SLOW)."""
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def http_get(base, path):
    """GET base + path with urllib: (status, body as text), an error status
    included."""
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=5 * SLOW) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Lines:
    """A reader of an Output's lines from a given one on."""

    def __init__(self, out, start=0):
        self.out, self.next = out, start

    def wait(self, pattern, timeout=5.0):
        deadline = time.monotonic() + timeout * SLOW
        seen = []
        with self.out.cv:
            while True:
                while self.next < len(self.out.got):
                    line = self.out.got[self.next].decode(errors="replace")
                    self.next += 1
                    seen.append(line)
                    if re.search(pattern, line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r}: {seen!r}")
                self.out.cv.wait(left)


@pytest.fixture
def tern_factory():
    servers = []

    def start(*args, cwd=None, bench_routes=True, api_key=True, open_topics=True):
        s = Server(list(args), cwd=cwd, bench_routes=bench_routes, api_key=api_key,
                   open_topics=open_topics)
        servers.append(s)
        return s

    yield start
    for s in servers:
        code = s.stop()
        assert code == 0, f"tern exited {code}: {s.stderr}"


@pytest.fixture
def tern(tern_factory):
    return tern_factory()


def recv_until_closed(sock, timeout=5.0):
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            b = sock.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks)


def read_response(sock, timeout=5.0, for_head=False):
    """Reads one HTTP/1.1 response (Content-Length, chunked, or until close).
    for_head=True: the response answers a HEAD request, so it has no body.
    Returns (status, headers dict lower-cased, body bytes, leftover bytes)."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = sock.recv(65536)
        if not b:
            raise EOFError(f"closed before a full head: {buf!r}")
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers.setdefault(k.strip().lower(), v.strip())
    if for_head or status in (204, 304) or 100 <= status < 200:
        return status, headers, b"", rest
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            b = sock.recv(65536)
            if not b:
                raise EOFError("closed inside a body")
            rest += b
        return status, headers, rest[:n], rest[n:]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += sock.recv(65536)
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            while len(rest) < size + 2:
                rest += sock.recv(65536)
            body += rest[:size]
            rest = rest[size + 2:]
            if size == 0:
                return status, headers, body, rest
    return status, headers, rest + recv_until_closed(sock), b""
