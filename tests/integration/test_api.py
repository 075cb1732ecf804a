"""What issue #10 added, as seen through `tern serve`: the log hook
(--log-level) and the access log (--access-log)."""
import base64
import os
import re
import subprocess
import time

from conftest import TERN_BIN, SLOW, read_response

# An RFC 3339 timestamp, UTC with milliseconds, as every log line starts.
TS = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def wait_for_lines(path, n, timeout=5.0):
    deadline = time.time() + timeout * SLOW
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if len(lines) >= n:
                return lines
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} lines in {path}")


def request(tern, raw):
    s = tern.connect()
    s.sendall(raw)
    st, h, body, _ = read_response(s)
    s.close()
    return st, h, body


def test_access_log_has_one_line_per_response(tern_factory, tmp_path):
    log = str(tmp_path / "access.log")
    tern = tern_factory("--access-log", log)
    request(tern, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    request(tern, b"POST /echo?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    request(tern, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    request(tern, b"DELETE /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    request(tern, b"GET /delay?ms=50 HTTP/1.1\r\nHost: x\r\n\r\n")          # answered later
    request(tern, b"GET /stream?chunks=3&size=10 HTTP/1.1\r\nHost: x\r\n\r\n")
    request(tern, b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n")       # refused: 400
    lines = wait_for_lines(log, 7)
    pat = re.compile(TS + r" 127\.0\.0\.1:\d+ (\S+) (\S+) (\d{3}) (\d+) (\d+)ms$")
    got = []
    for l in lines:
        m = pat.match(l)
        assert m, l
        got.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))))
    assert got[0][:4] == ("GET", "/ping", 200, 4)
    assert got[1][:4] == ("POST", "/echo?x=1", 200, 5)
    assert got[2][:3] == ("GET", "/nope", 404)
    assert got[3][:3] == ("DELETE", "/ping", 405)
    assert got[4][:4] == ("GET", "/delay?ms=50", 200, 5)
    assert got[4][4] >= 40
    assert got[5][:4] == ("GET", "/stream?chunks=3&size=10", 200, 30)
    assert got[6][:3] == ("-", "-", 400)


def test_access_log_has_the_websocket_session_at_its_end(tern_factory, tmp_path):
    """Not at the 101 (0 bytes, 0 ms): one line when the session ends, with
    its length, bytes and messages each way, and how it closed."""
    log = str(tmp_path / "access.log")
    tern = tern_factory("--access-log", log, "--no-compression")
    key = base64.b64encode(os.urandom(16))
    s = tern.connect()
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    st, _, _, rest = read_response(s)
    assert st == 101
    time.sleep(0.3)
    assert not os.path.exists(log) or open(log).read() == "", "logged before its end"
    # "hello", masked with a zero key (11 bytes), echoed unmasked (7 bytes)
    s.sendall(b"\x81\x85\x00\x00\x00\x00hello")
    while len(rest) < 7:
        rest += s.recv(100)
    assert rest[:7] == b"\x81\x05hello"
    # close 1000 from the client (8 bytes), echoed (4 bytes); then the end
    s.sendall(b"\x88\x82\x00\x00\x00\x00\x03\xe8")
    while s.recv(100):
        pass
    s.close()
    lines = wait_for_lines(log, 1)
    m = re.match(TS + r" 127\.0\.0\.1:\d+ GET /ws 101 (\d+) (\d+)ms ws in=(\d+) msgs=(\d+)/(\d+) "
                 r"close=(\d+)/(\w+)$", lines[0])
    assert m, lines
    out, ms, inb, min_, mout, code, side = m.groups()
    assert (int(out), int(inb), int(min_), int(mout)) == (7 + 4, 11 + 8, 1, 1), lines
    assert int(ms) >= 250, lines
    assert (code, side) == ("1000", "client"), lines


def test_access_log_never_shows_a_token(tern_factory, tmp_path):
    # Browsers give a WebSocket no Authorization header: a token comes in
    # the query, and the log keeps the rest of the target but not it.
    log = str(tmp_path / "access.log")
    tern = tern_factory("--access-log", log)
    for target in (b"/ping?token=s3cr3t.jwt.x", b"/ping?a=1&token=s3cr3t.jwt.x&b=2",
                   b"/ping?access_token=s3cr3t.jwt.x", b"/ping?mytoken=kept"):
        st, _, _ = request(tern, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert st == 200
    lines = wait_for_lines(log, 4)
    assert "s3cr3t" not in "".join(lines), lines
    targets = [l.split(" ")[3] for l in lines]
    assert targets == ["/ping?token=-", "/ping?a=1&token=-&b=2", "/ping?access_token=-",
                       "/ping?mytoken=kept"], targets


def test_debug_log_names_refused_upgrades_and_requests(tern_factory):
    tern = tern_factory("--log-level", "debug", "--ws-origin", "http://good")
    key = base64.b64encode(os.urandom(16))
    st, _, _ = request(tern, b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                       b"Connection: Upgrade\r\nOrigin: http://evil\r\nSec-WebSocket-Key: " + key +
                       b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert st == 403
    st, _, _ = request(tern, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 17000 + b"\r\n\r\n")
    assert st == 431
    assert tern.stop() == 0
    err = tern.stderr
    assert re.search(r"tern: \[debug\] ws: upgrade of /ws from 127\.0\.0\.1:\d+ refused: 403", err), err
    assert re.search(r"tern: \[debug\] http: 431 Request Header Fields Too Large to 127\.0\.0\.1:\d+, closing", err), err


def test_debug_log_names_the_servers_own_405_501(tern_factory):
    """logging.md: debug is every refusal, 4xx/5xx before a handler: the
    server's own 405 and 501 too, not only the 400s that close (tern
    serve's 404 is its tern_http_not_found handler's: the unit test
    test_http_conn has the library's own 404). The line names the method
    and the path, never the query (a ?token=)."""
    tern = tern_factory("--log-level", "debug")
    assert request(tern, b"DELETE /ping?token=s3cr3t HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 405
    assert request(tern, b"BREW /ping HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 501
    assert tern.stop() == 0
    err = tern.stderr
    peer = r"127\.0\.0\.1:\d+"
    assert re.search(r"tern: \[debug\] http: 405 Method Not Allowed for DELETE /ping to " + peer + "$",
                     err, re.M), err
    assert re.search(r"tern: \[debug\] http: 501 Not Implemented for BREW /ping to " + peer + "$",
                     err, re.M), err
    assert "s3cr3t" not in err


def test_a_413_after_the_head_names_its_request(tern_factory, tmp_path):
    """A body over --max-body, by its Content-Length or as it is read
    (chunked), is refused after the head was read: the access log and the
    debug line name the method and target, not "-"."""
    log = str(tmp_path / "access.log")
    tern = tern_factory("--max-body", "100", "--access-log", log, "--log-level", "debug")
    st, _, _ = request(tern, b"POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n")
    assert st == 413
    lines = wait_for_lines(log, 1)
    chunk = b"%x\r\n" % 80 + b"y" * 80 + b"\r\n"
    st, _, _ = request(tern, b"POST /echo?b=2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       + chunk + chunk + b"0\r\n\r\n")
    assert st == 413
    lines = wait_for_lines(log, 2)
    pat = re.compile(TS + r" 127\.0\.0\.1:\d+ (\S+) (\S+) (\d{3}) ")
    got = [pat.match(l).groups() for l in lines]
    assert got == [("POST", "/echo?a=1", "413"), ("POST", "/echo?b=2", "413")], lines
    assert tern.stop() == 0
    assert len(re.findall(r"tern: \[debug\] http: 413 Content Too Large for POST /echo to "
                          r"127\.0\.0\.1:\d+, closing$", tern.stderr, re.M)) == 2, tern.stderr


def test_default_log_level_leaves_refusals_out(tern):
    st, _, _ = request(tern, b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n")
    assert st == 400
    assert tern.stop() == 0
    assert "[debug]" not in tern.stderr


def test_bad_log_level_is_refused():
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--log-level", "loud"],
                       capture_output=True, timeout=10)
    assert r.returncode == 2
    assert b"--log-level" in r.stderr
