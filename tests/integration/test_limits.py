"""The limits that protect the server from one client (issue #26): open
connections in all and per address, the WebSocket Origin, and /pubsub's
message size and operation rate."""
import json
import socket
import time

from conftest import SLOW, read_response
from test_tls import certs  # noqa: F401  (the session's certificates)


def conn_from(tern, source="127.0.0.1"):
    s = socket.create_connection((tern.host, tern.port), timeout=5 * SLOW,
                                 source_address=(source, 0))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def ask(s, path="/ping"):
    """One request on s: (status, headers, body)."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, headers, body, _ = read_response(s, timeout=5 * SLOW)
    return status, headers, body


def served(tern, source="127.0.0.1"):
    """A new connection from source: its answer to /ping (503 when refused),
    and the socket."""
    s = conn_from(tern, source)
    try:
        return ask(s)[0], s
    except (ConnectionResetError, EOFError):
        s.close()
        raise


def stats(tern):
    # the admin listener's: a server of its own, outside these limits
    return tern.stats()["total"]


def wait_open(tern, n):
    """Until the server has n connections open (/stats' own is the admin
    listener's, not one of them)."""
    deadline = time.monotonic() + 5 * SLOW
    while time.monotonic() < deadline:
        if stats(tern)["connections"] == n:
            return
        time.sleep(0.02)
    raise AssertionError(f"connections never came to {n}: {stats(tern)}")


def refused(s):
    status, headers, body = read_response(s, timeout=5 * SLOW)[:3]
    assert status == 503, (status, body)
    assert headers.get("retry-after") == "1"
    assert headers.get("connection") == "close"
    s.settimeout(5 * SLOW)
    try:
        assert s.recv(1) == b""   # then closed
    except ConnectionResetError:
        pass


def test_51st_connection_from_one_address_is_refused(tern_factory):
    tern = tern_factory("--max-connections-per-ip", "50")
    held = []
    try:
        for _ in range(50):
            status, s = served(tern)
            assert status == 200
            held.append(s)
        # The 51st is answered 503 at once, without being asked anything.
        extra = conn_from(tern)
        refused(extra)
        extra.close()
        # Another address is served meanwhile.
        status, other = served(tern, "127.0.0.2")
        assert status == 200
        other.close()
        st = stats(tern)
        assert st["refused_per_ip"] == 1 and st["refused_max_connections"] == 0
        # Closing one frees its place.
        held.pop().close()
        wait_open(tern, 49)
        status, s = served(tern)
        assert status == 200
        held.append(s)
        refused(conn_from(tern))
        assert stats(tern)["refused_per_ip"] == 2
    finally:
        for s in held:
            s.close()


def test_max_connections_counts_every_address(tern_factory):
    tern = tern_factory("--max-connections", "5", "--threads", "2")
    held = []
    try:
        for i in range(5):
            status, s = served(tern, f"127.0.0.{i + 1}")
            assert status == 200
            held.append(s)
        # The 6th is refused whatever its address and whichever thread
        # accepts it: the count is the process's.
        for i in range(4):
            refused(conn_from(tern, f"127.0.0.{10 + i}"))
        # /stats is the admin listener's: it needs no place among these 5
        st = stats(tern)
        assert st["refused_max_connections"] >= 4 and st["refused_per_ip"] == 0
    finally:
        for s in held:
            s.close()


def test_limit_flags_are_checked_and_documented(tern_factory):
    import subprocess
    from conftest import TERN_BIN
    out = subprocess.run([TERN_BIN, "serve", "--help"], capture_output=True, text=True).stdout
    assert "--max-connections N" in out and "--max-connections-per-ip N" in out
    for bad in ("-1", "x", "99999999999"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--max-connections", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "--max-connections" in r.stderr


def upgrade(tern, path="/ws", origin=None):
    """A WebSocket upgrade with that Origin (None: no header): the status."""
    s = conn_from(tern)
    try:
        extra = f"Origin: {origin}\r\n" if origin is not None else ""
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
        return read_response(s, timeout=5 * SLOW, for_head=True)[0]
    finally:
        s.close()


def test_allowed_origins_exact_and_wildcard(tern_factory):
    tern = tern_factory("--allowed-origin", "https://app.example.com",
                        "--allowed-origin", "https://*.example.org")
    for path in ("/ws", "/pubsub", "/ws/broadcast", "/fanout/sub"):
        assert upgrade(tern, path, "https://app.example.com") == 101
        assert upgrade(tern, path, "https://evil.example.com") == 403
        assert upgrade(tern, path) == 101   # no Origin: not a browser
    for ok in ("https://a.example.org", "https://a.b.example.org", "HTTPS://A.Example.ORG"):
        assert upgrade(tern, "/ws", ok) == 101, ok
    for bad in ("https://example.org", "http://a.example.org", "https://a.example.org:8443",
                "https://a.example.org.evil.com", "https://evilexample.org", "null",
                "https://app.example.com.evil", "https://.example.org", "https://a..example.org",
                "https://a/b.example.org"):
        assert upgrade(tern, "/ws", bad) == 403, bad


def test_no_allowed_origin_lets_any_origin_in(tern):
    assert upgrade(tern, "/ws", "https://anything.example") == 101
    assert upgrade(tern, "/ws") == 101


def test_allowed_origin_values_are_checked(tern_factory):
    import subprocess
    from conftest import TERN_BIN
    for bad in ("app.example.com", "https://", "https://a.com/path", "ftp://a.com",
                "https://a.*.com", "https://a.com:x", "*"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--allowed-origin", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "--allowed-origin" in r.stderr, bad


def pubsub(tern, source="127.0.0.1"):
    from websockets.sync.client import connect
    return connect(f"ws://127.0.0.1:{tern.port}/pubsub", max_size=None,
                   open_timeout=5 * SLOW)


def close_code(ws, timeout):
    """Reads until the server closes ws: its close code."""
    from websockets.exceptions import ConnectionClosed
    try:
        while True:
            ws.recv(timeout=timeout)
    except ConnectionClosed as e:
        return e.rcvd.code if e.rcvd else None


def test_pubsub_message_over_max_closes_1009(tern_factory):
    tern = tern_factory("--pubsub-max-message", "65536")
    with pubsub(tern) as ws:
        ok = json.dumps({"op": "publish", "topic": "t", "data": "x" * 60000})
        ws.send(ok)
        assert json.loads(ws.recv(timeout=5 * SLOW))["ok"] == "publish"
        ws.send(json.dumps({"op": "publish", "topic": "t", "data": "x" * 70000}))
        assert close_code(ws, 5 * SLOW) == 1009
    deadline = time.monotonic() + 5 * SLOW
    while stats_all(tern)["pubsub_limits"]["too_big"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def stats_all(tern):
    return tern.stats()


def test_pubsub_burst_is_refused_then_closed_while_a_polite_client_is_not(tern_factory):
    import threading
    tern = tern_factory("--pubsub-rate", "100")
    polite_errors, polite_acks = [], []

    def polite():
        # 50 a second for 3 s: under the rate, never refused.
        with pubsub(tern) as ws:
            for i in range(150):
                ws.send(json.dumps({"op": "publish", "topic": "p", "data": str(i)}))
                r = json.loads(ws.recv(timeout=5 * SLOW))
                (polite_errors if "error" in r else polite_acks).append(r)
                time.sleep(0.02)

    t = threading.Thread(target=polite)
    t.start()
    from websockets.exceptions import ConnectionClosed
    with pubsub(tern) as ws:
        # The server may close (at the 202nd) before the last sends: the
        # answers sent before the close are read all the same.
        try:
            for i in range(300):
                ws.send(json.dumps({"op": "publish", "topic": "b", "data": str(i)}))
        except ConnectionClosed:
            pass
        oks = errors = 0
        try:
            while True:
                r = json.loads(ws.recv(timeout=5 * SLOW))
                if "ok" in r:
                    oks += 1
                else:
                    assert r == {"error": "rate limit", "op": "publish"}, r
                    errors += 1
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
    t.join()
    # The burst of 100 goes through, then 100 refusals are answered, and
    # the next one closes.
    assert code == 1008
    assert 100 <= oks < 110 and errors == 101, (oks, errors)
    assert polite_errors == [] and len(polite_acks) == 150
    lim = stats_all(tern)["pubsub_limits"]
    assert lim["rate_refused"] == 101 and lim["rate_closed"] == 1 and lim["too_big"] == 0


def test_pubsub_rate_refills(tern_factory):
    tern = tern_factory("--pubsub-rate", "20")
    with pubsub(tern) as ws:
        for _ in range(2):
            for i in range(25):
                ws.send(json.dumps({"op": "subscribe", "topic": f"t{i}"}))
            got = [json.loads(ws.recv(timeout=5 * SLOW)) for _ in range(25)]
            assert 20 <= sum("ok" in g for g in got) <= 21
            assert all(g == {"error": "rate limit", "op": "subscribe"} for g in got if "error" in g)
            time.sleep(1.1)   # a full bucket again: the strikes are forgiven


def test_limits_over_wss(tern_factory, certs):  # noqa: F811
    """The same limits on the TLS port: the 4th connection from an address
    over 3 is refused (closed before the handshake: nothing can be said in
    the clear), a message over the size closes with 1009 and a flood with
    1008."""
    import asyncio
    import ssl
    from websockets.asyncio.client import connect as aconnect
    from websockets.exceptions import ConnectionClosed
    cert, key = certs["default"]
    tern = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                        "--max-connections-per-ip", "3", "--pubsub-max-message", "65536",
                        "--pubsub-rate", "20")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    url = f"wss://127.0.0.1:{tern.tls_port}/pubsub"

    async def closed_with(ws):
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 5 * SLOW)
        except ConnectionClosed as e:
            return e.rcvd.code if e.rcvd else None

    async def go():
        async with aconnect(url, ssl=ctx) as a, aconnect(url, ssl=ctx) as b, \
                aconnect(url, ssl=ctx) as c:
            try:
                async with aconnect(url, ssl=ctx, open_timeout=5 * SLOW):
                    raise AssertionError("the 4th connection was let in")
            except (OSError, EOFError, ssl.SSLError, ConnectionClosed):
                pass   # refused: the handshake never completed
            assert stats(tern)["refused_per_ip"] == 1
            await a.send(json.dumps({"op": "publish", "topic": "t", "data": "x" * 70000}))
            assert await closed_with(a) == 1009
            for i in range(60):   # a burst of 20, 20 refused, then the close
                try:
                    await b.send(json.dumps({"op": "publish", "topic": "t", "data": str(i)}))
                except ConnectionClosed:
                    break
            assert await closed_with(b) == 1008
            await c.send(json.dumps({"op": "subscribe", "topic": "t"}))
            assert "ok" in json.loads(await asyncio.wait_for(c.recv(), 5 * SLOW))
    asyncio.run(go())
