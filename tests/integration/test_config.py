"""tern serve's configuration (#27): one option table behind the flags, a
--config file, the environment (TERN_NAME) and --print-config; flags over
environment over file over defaults; bad files refused naming file:line;
SIGHUP applies what may change live and names the rest, and a file that does
not parse changes nothing. README's option list is the one of --help."""
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import SLOW, TERN_BIN, wait_for

# A value for every option a file may hold, unlike its default. An option
# added to the table without one here fails test_every_option_*.
SAMPLES = {
    "host": "127.0.0.2", "port": "8081", "unix": "/tmp/tern-x.sock", "reuse-port": "on",
    "tls-cert": "a.pem",
    "tls-key": "a.key", "tls-key-passphrase-file": "pass.txt", "tls-port": "8444",
    "tls-min-version": "1.3", "tls-ciphers": "HIGH", "tls-ciphersuites": "TLS_AES_128_GCM_SHA256",
    "tls-client-ca": "ca.pem", "tls-client-verify": "require", "http2": "h2c",
    "bench-routes": "on",
    "admin-listen": "127.0.0.1:9091", "api-key-file": "key.txt", "root": "/srv",
    "max-head": "1024", "max-body": "2048", "head-timeout": "5", "body-timeout": "6",
    "idle-timeout": "7", "send-timeout": "8", "max-unsent": "9999", "max-connections": "11",
    "max-connections-per-ip": "12", "sndbuf": "8192", "shutdown-timeout": "13",
    "shutdown-spread": "9", "redis-password-file": "redis-pass.txt", "log-format": "json",
    "ws-max-message": "14", "ws-idle-timeout": "15", "no-compression": "on",
    "allowed-origin": "https://a.example", "ws-origin": "https://b.example",
    "ws-slow-policy": "drop", "ws-async": "post", "ws-deadline-ms": "16",
    "pubsub-max-backlog": "17", "pubsub-max-message": "18", "pubsub-rate": "19",
    "pubsub-policy": "conflate", "pubsub-topic-policy": "t.=close", "pubsub-history": "20",
    "topic": "orders.* subscribe=anyone history=10", "pubsub-history-bytes": "1000",
    "pubsub-history-age": "21", "pubsub-replay-rate": "22", "pubsub-write-delay": "23",
    "join-leave-throttle": "26",
    "token-hmac-secret-file": "s.txt",
    "token-public-key-file": "pk.pem", "token-audience": "aud", "token-issuer": "iss",
    "feed": "off", "feed-rate": "23", "page": "off", "node-name": "eu-1.a", "bridge": "nats://127.0.0.1:4222",
    "redis": "redis://127.0.0.1:6379", "log-level": "debug",
    "access-log": "-", "threads": "3", "io": "uring", "vhost": "a=/srv", "quiet": "on",
    "admin-listen-public": "on", "drain-delay": "24", "token-leeway": "25",
    "proxy-connect": "http://127.0.0.1:9/c", "proxy-refresh": "http://127.0.0.1:9/r", "proxy-subscribe": "http://127.0.0.1:9/s", "proxy-publish": "http://127.0.0.1:9/p",
    "proxy-timeout": "26", "proxy-max-inflight": "27",
}


def serve(*args, env=None, timeout=10):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TERN_") or k == "TERN_BIN"}
    e.update(env or {})
    return subprocess.run([TERN_BIN, "serve", *args], capture_output=True, text=True,
                          timeout=timeout * SLOW, env=e)


def config_lines(text):
    """--print-config's settings as {name: [values]}, comments dropped."""
    out = {}
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line)
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        out.setdefault(name, []).append(value)
    return out


def file_keys():
    """Every option a file may hold: --print-config names each, set or not."""
    r = serve("--print-config")
    assert r.returncode == 0, r.stderr
    names = []
    for line in r.stdout.splitlines()[2:]:
        m = re.match(r"^(?:# )?([a-z0-9-]+)(?: |$)", line)
        assert m, line
        names.append(m.group(1))
    return names


def test_every_option_has_a_sample():
    assert sorted(file_keys()) == sorted(SAMPLES)


def test_every_option_is_settable_by_file(tmp_path):
    conf = tmp_path / "tern.conf"
    conf.write_text("".join(f"{k} {v}\n" for k, v in SAMPLES.items()))
    r = serve("--config", str(conf), "--print-config")
    assert r.returncode == 0, r.stderr
    got = config_lines(r.stdout)
    for k, v in SAMPLES.items():
        assert got.get(k) == [v], (k, got.get(k))


def test_every_option_is_settable_by_environment():
    env = {"TERN_" + k.upper().replace("-", "_"): v for k, v in SAMPLES.items()}
    r = serve("--print-config", env=env)
    assert r.returncode == 0, r.stderr
    got = config_lines(r.stdout)
    for k, v in SAMPLES.items():
        assert got.get(k) == [v], (k, got.get(k))
    assert "max-connections 11  # environment" in r.stdout


def test_every_option_is_settable_by_flag():
    args = []
    for k, v in SAMPLES.items():
        if v == "on":   # a flag takes no value on the command line
            args.append("--" + k)
        else:
            args.append(f"--{k}={v}")
    r = serve(*args, "--print-config")
    assert r.returncode == 0, r.stderr
    got = config_lines(r.stdout)
    for k, v in SAMPLES.items():
        assert got.get(k) == [v], (k, got.get(k))


def test_precedence_flags_environment_file_defaults(tmp_path):
    conf = tmp_path / "tern.conf"
    conf.write_text("max-connections 1\nmax-head 1000\nfeed-rate 5\n"
                    "allowed-origin https://file.example\n")
    env = {"TERN_MAX_CONNECTIONS": "2", "TERN_MAX_HEAD": "2000",
           "TERN_ALLOWED_ORIGIN": "https://env.example"}
    got = config_lines(serve("--config", str(conf), "--max-connections", "3",
                             "--print-config", env=env).stdout)
    assert got["max-connections"] == ["3"]          # flag
    assert got["max-head"] == ["2000"]              # environment over file
    assert got["feed-rate"] == ["5"]                # file over default
    assert got["max-body"] == ["16777216"]          # default
    assert got["allowed-origin"] == ["https://env.example"]   # a list is replaced whole
    got = config_lines(serve("--config", str(conf), "--print-config").stdout)
    assert got["max-connections"] == ["1"] and got["max-head"] == ["1000"]


def test_print_config_fed_back_gives_the_same_configuration(tmp_path):
    r1 = serve("--port", "7000", "--tls-cert", "a.pem", "--tls-key", "a.key",
               "--tls-cert", "b.pem", "--tls-key", "b.key", "--quiet", "--ws-async",
               "--pubsub-topic-policy", "news.=conflate", "--threads", "2", "--print-config",
               env={"TERN_FEED_RATE": "9"})
    assert r1.returncode == 0, r1.stderr
    conf = tmp_path / "printed.conf"
    conf.write_text(r1.stdout)
    r2 = serve("--config", str(conf), "--print-config")
    assert r2.returncode == 0, r2.stderr
    assert config_lines(r2.stdout) == config_lines(r1.stdout)
    assert config_lines(r2.stdout)["tls-cert"] == ["a.pem", "b.pem"]


@pytest.mark.parametrize("flag, url, shown", [
    ("--bridge", "redis://:s3cret@127.0.0.1:6379/2", "redis://:****@127.0.0.1:6379/2"),
    ("--redis", "redis://tern:s3cret@127.0.0.1:6379", "redis://tern:****@127.0.0.1:6379"),
    ("--bridge", "nats://tern:s3cret@127.0.0.1:4222", "nats://tern:****@127.0.0.1:4222"),
    ("--bridge", "nats://s3cret@127.0.0.1:4222,nats://127.0.0.1:4223",
     "nats://****@127.0.0.1:4222,nats://127.0.0.1:4223"),
    ("--redis", "tls://s3cret@127.0.0.1:4222?ca=ca.pem", "tls://****@127.0.0.1:4222?ca=ca.pem"),
    ("--bridge", "nats://127.0.0.1:4222,tern:s3cret@127.0.0.1:4223?creds=c,x",
     "nats://127.0.0.1:4222,tern:****@127.0.0.1:4223?creds=c,x"),
    ("--bridge", "redis://tern@127.0.0.1:6379", "redis://tern@127.0.0.1:6379"),
])
def test_print_config_masks_the_bridge_urls_secret(flag, url, shown):
    """A password or token in the bridge's URL never reaches --print-config
    (from a flag, the environment or a file): "****" stands for it."""
    name = flag[2:]
    env = {"TERN_" + name.upper(): url}
    for r in (serve(flag, url, "--print-config"), serve("--print-config", env=env)):
        assert r.returncode == 0, r.stderr
        assert "s3cret" not in r.stdout
        assert config_lines(r.stdout)[name] == [shown]


def test_bridge_and_its_older_name_redis_are_not_both_taken():
    r = serve("--bridge", "nats://127.0.0.1:1", "--redis", "redis://127.0.0.1:1", "--port", "0")
    assert r.returncode == 2
    assert "--redis is the older name of --bridge" in r.stderr


@pytest.mark.parametrize("text, line, message", [
    ("port 8080\nmax-conections 10\n", 2, "unknown option 'max-conections'"),
    ("# c\n\nport 1\nport 2\n", 4, "port given again (first on line 3"),
    ("max-connections ten thousand\n", 1, "bad value for max-connections: ten thousand"),
    ("pubsub-policy later\n", 1, "bad value for pubsub-policy: later (one of"),
    ("quiet sometimes\n", 1, "bad value for quiet: sometimes (on or off)"),
    ("host\n", 1, "host needs a value"),
    ("config other.conf\n", 1, "unknown option 'config'"),
])
def test_bad_files_are_refused_with_file_and_line(tmp_path, text, line, message):
    conf = tmp_path / "bad.conf"
    conf.write_text(text)
    r = serve("--config", str(conf), "--port", "0")
    assert r.returncode == 2
    assert f"{conf}:{line}: {message}" in r.stderr, r.stderr


def test_a_missing_file_is_an_error(tmp_path):
    r = serve("--config", str(tmp_path / "none.conf"), "--port", "0")
    assert r.returncode == 2 and "none.conf: No such file" in r.stderr, r.stderr
    r = serve("--config", str(tmp_path), "--port", "0")   # a directory
    assert r.returncode == 2 and "Is a directory" in r.stderr, r.stderr


def test_a_bad_environment_value_is_an_error():
    r = serve("--port", "0", env={"TERN_MAX_CONNECTIONS": "many"})
    assert r.returncode == 2
    assert "bad value for TERN_MAX_CONNECTIONS (--max-connections): many" in r.stderr


# ---- a running server -------------------------------------------------------

class Lines:
    """The server's stderr, line by line, from a thread (the pipe is read
    while the test waits for a given line)."""

    def __init__(self, f):
        self.q = queue.Queue()
        threading.Thread(target=self._read, args=(f,), daemon=True).start()

    def _read(self, f):
        for line in iter(f.readline, b""):
            self.q.put(line.decode(errors="replace"))

    def wait(self, pattern, timeout=5.0):
        deadline = time.monotonic() + timeout * SLOW
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r}: {seen!r}")


def upgrade_status(port, origin=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=5 * SLOW)
    head = ("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    if origin:
        head += f"Origin: {origin}\r\n"
    s.sendall((head + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), s


def ws_echo(s, text):
    payload = text.encode()
    mask = b"\x01\x02\x03\x04"
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask +
              bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    head = s.recv(2)
    return s.recv(head[1] & 0x7F).decode()


def test_file_options_take_effect(tern_factory, tmp_path):
    conf = tmp_path / "tern.conf"
    conf.write_text("# the origins browsers may come from\n"
                    "allowed-origin https://good.example\n"
                    "max-head 2048\n")
    t = tern_factory("--config", str(conf))
    assert upgrade_status(t.port, "https://good.example")[0] == 101
    assert upgrade_status(t.port, "https://evil.example")[0] == 403
    s = t.connect()
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 431")


def test_sighup_applies_what_may_change_and_names_the_rest(tern_factory, tmp_path):
    conf = tmp_path / "tern.conf"
    conf.write_text("allowed-origin https://old.example\nfeed-rate 40\n")
    t = tern_factory("--config", str(conf))
    lines = t.lines()
    status, kept = upgrade_status(t.port, "https://old.example")
    assert status == 101
    assert upgrade_status(t.port, "https://new.example")[0] == 403

    conf.write_text("allowed-origin https://new.example\nfeed-rate 10\ntls-port 9443\n")
    t.proc.send_signal(signal.SIGHUP)
    line = lines.wait(r"SIGHUP: .*tern\.conf read")
    assert "applied allowed-origin" in line
    assert "not applied (they need a restart): tls-port, feed-rate" in line
    assert upgrade_status(t.port, "https://new.example")[0] == 101
    assert upgrade_status(t.port, "https://old.example")[0] == 403
    assert ws_echo(kept, "still here") == "still here"   # no connection dropped

    # A file that does not parse changes nothing.
    conf.write_text("allowed-origin https://third.example\nmax-connections lots\n")
    t.proc.send_signal(signal.SIGHUP)
    line = lines.wait(r"SIGHUP: ")
    assert f"{conf}:2: bad value for max-connections: lots" in line
    assert "kept as it was" in line
    assert upgrade_status(t.port, "https://new.example")[0] == 101
    assert upgrade_status(t.port, "https://third.example")[0] == 403


def serve_with_config_only(conf):
    """tern serve with the file conf alone: no TERN_* environment and not
    conftest's server, which turns the rate off with a flag (and a flag
    wins over the file). The process, its stderr's lines, its port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERN_") or k == "TERN_BIN"}
    p = subprocess.Popen([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--admin-listen",
                          "off", "--config", str(conf)], stderr=subprocess.PIPE, env=env)
    lines = Lines(p.stderr)
    port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)/",
                         lines.wait("listening on")).group(1))
    return p, lines, port


def rate_refused(ws, n):
    """Of n publishes on the /pubsub connection ws, one answer awaited
    after each, how many were refused with "rate limit"."""
    import json
    answers = []
    for i in range(n):
        ws.send(json.dumps({"op": "publish", "topic": "t", "data": str(i)}))
        answers.append(json.loads(ws.recv(timeout=5 * SLOW)))
    return sum(1 for a in answers if a.get("error") == "rate limit")


def test_sighup_changes_the_pubsub_rate(tmp_path):
    """A limit changed live: /pubsub's rate, from 2 a second to none."""
    from websockets.sync.client import connect
    conf = tmp_path / "tern.conf"
    conf.write_text("pubsub-rate 2\n")
    p, lines, port = serve_with_config_only(conf)
    try:
        # A burst of 2: of 4 at once, the last are refused (unless the
        # machine stalls for a second between them).
        with connect(f"ws://127.0.0.1:{port}/pubsub") as ws:
            assert rate_refused(ws, 4) >= 1
        conf.write_text("pubsub-rate 0\n")
        p.send_signal(signal.SIGHUP)
        assert "applied pubsub-rate" in lines.wait(r"SIGHUP: .*tern\.conf read")
        with connect(f"ws://127.0.0.1:{port}/pubsub") as ws:
            assert rate_refused(ws, 50) == 0
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0


def test_sighup_limits_a_connection_opened_while_unlimited(tmp_path):
    """The other way: a /pubsub connection opened while the rate was 0
    (unlimited) follows a rate that SIGHUP sets, from its next message."""
    from websockets.sync.client import connect
    conf = tmp_path / "tern.conf"
    conf.write_text("pubsub-rate 0\n")
    p, lines, port = serve_with_config_only(conf)
    try:
        with connect(f"ws://127.0.0.1:{port}/pubsub") as ws:
            assert rate_refused(ws, 20) == 0
            conf.write_text("pubsub-rate 2\n")
            p.send_signal(signal.SIGHUP)
            assert "applied pubsub-rate" in lines.wait(r"SIGHUP: .*tern\.conf read")
            # A burst of 2, the bucket full again at the new rate: of 4 at
            # once, at least one is refused.
            assert rate_refused(ws, 4) >= 1
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0


def test_sighup_rate_change_keeps_a_connections_presence(tmp_path):
    """A rate changed by SIGHUP refills a connection's bucket and keeps the
    rest of its state: its presence entries leave with it when it closes
    (they stayed behind as a ghost, leaked, once the bucket was rebuilt
    without them)."""
    import json
    from websockets.sync.client import connect
    conf = tmp_path / "tern.conf"
    conf.write_text("pubsub-rate 100\ntopic room.* subscribe=anyone presence=on\n")
    p, lines, port = serve_with_config_only(conf)

    def stats(ws):
        ws.send(json.dumps({"op": "presence_stats", "topic": "room.1"}))
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if m.get("ok") == "presence_stats":
                return m["clients"]
    try:
        with connect(f"ws://127.0.0.1:{port}/pubsub") as a:
            a.send(json.dumps({"op": "subscribe", "topic": "room.1"}))
            assert stats(a) == 1
            conf.write_text("pubsub-rate 50\ntopic room.* subscribe=anyone presence=on\n")
            p.send_signal(signal.SIGHUP)
            assert "applied pubsub-rate" in lines.wait(r"SIGHUP: .*tern\.conf read")
            assert stats(a) == 1   # asked at the new rate: the bucket refilled
        with connect(f"ws://127.0.0.1:{port}/pubsub") as b:
            wait_for(lambda: stats(b) == 0, "a closed connection gone from presence (no ghost)")
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0


def test_readme_lists_the_options_of_help():
    """README's option list is `tern serve --help`'s, the table's: an option
    added, renamed or documented differently fails here until README says
    the same (paste the help's option lines between the markers)."""
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme) as f:
        text = f.read()
    m = re.search(r"<!-- options: .*? -->\n```\n(.*?)```\n<!-- end of options -->", text, re.S)
    assert m, "README has no option list between its markers"
    out = subprocess.run([TERN_BIN, "serve", "--help"], capture_output=True, text=True).stdout
    listed = out.split("\n", 2)[2]
    assert m.group(1) == listed, "README's option list differs: run scripts/readme-options.py"


def test_sighup_reads_rotated_token_keys(tern_factory, tmp_path):
    """The token secret's file rewritten and SIGHUP: new tokens verify with
    the new key, old ones no longer do, and a connection opened before stays
    open; a secret file that does not load keeps the key in use."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect
    from test_tokens import claims, token

    def status(tok):
        try:
            with connect(f"ws://127.0.0.1:{t.port}/pubsub?token={tok}",
                         open_timeout=5 * SLOW):
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    secret = tmp_path / "secret"
    secret.write_bytes(b"first-secret\n")
    conf = tmp_path / "tern.conf"
    conf.write_text(f"token-hmac-secret-file {secret}\n")
    t = tern_factory("--config", str(conf), "--feed", "off")
    lines = t.lines()
    old, new = token(claims(), secret=b"first-secret"), token(claims(), secret=b"second-secret")
    assert status(old) == 101 and status(new) == 401
    st, kept = upgrade_status(t.port)   # /ws, open across the reload
    assert st == 101

    secret.write_bytes(b"second-secret\n")
    t.proc.send_signal(signal.SIGHUP)
    lines.wait(r"SIGHUP: .*tern\.conf read: no option changed")
    assert status(new) == 101 and status(old) == 401
    assert ws_echo(kept, "kept") == "kept"

    # An empty secret file does not load: the second key stays in use.
    secret.write_bytes(b"")
    t.proc.send_signal(signal.SIGHUP)
    assert "kept as it was" in lines.wait(r"SIGHUP: the configuration is kept")
    assert status(new) == 101

    # Turning tokens off needs a restart: named, not applied.
    secret.write_bytes(b"second-secret\n")
    conf.write_text("")
    t.proc.send_signal(signal.SIGHUP)
    line = lines.wait(r"SIGHUP: .*tern\.conf read")
    assert "not applied (they need a restart): token-hmac-secret-file" in line
    assert status(new) == 101 and status(old) == 401


def test_sighup_applies_a_changed_topic_rule(tern_factory, tmp_path):
    """Who may subscribe changes live, without dropping a connection; a
    changed history (the library's setting) is named and nothing of the
    rules changes."""
    import asyncio
    import json
    import websockets
    conf = tmp_path / "tern.conf"
    conf.write_text("topic news.* subscribe=none\n")
    # conftest's --topic would replace the file's (a flag's list is the list)
    t = tern_factory("--config", str(conf), "--feed", "off", open_topics=False)
    lines = t.lines()
    url = f"ws://127.0.0.1:{t.port}/pubsub"

    async def subscribe(ws, topic):
        await ws.send(json.dumps({"op": "subscribe", "topic": topic}))
        return json.loads(await asyncio.wait_for(ws.recv(), 5 * SLOW))

    async def go():
        async with websockets.connect(url) as kept:
            assert (await subscribe(kept, "news.a")).get("error") == "forbidden"
            conf.write_text("topic news.* subscribe=anyone\n")
            t.proc.send_signal(signal.SIGHUP)
            line = await asyncio.to_thread(lines.wait, r"SIGHUP: .*tern\.conf read")
            assert "applied topic" in line, line
            assert (await subscribe(kept, "news.b")).get("ok") == "subscribe"
            t.publish("news.b", "hello")
            got = json.loads(await asyncio.wait_for(kept.recv(), 5 * SLOW))
            assert got["topic"] == "news.b" and got["data"] == "hello"

            conf.write_text("topic news.* subscribe=none history=10\n")
            t.proc.send_signal(signal.SIGHUP)
            line = await asyncio.to_thread(lines.wait, r"SIGHUP: .*tern\.conf read")
            assert "not applied (they need a restart): topic" in line, line
            assert (await subscribe(kept, "news.c")).get("ok") == "subscribe"   # still anyone
    asyncio.run(go())


# ---- TERN_CONFIG, misspelt variables, --version, the manual page (#37) -------

def test_tern_config_names_the_file_and_the_flag_wins(tmp_path):
    env_conf = tmp_path / "env.conf"
    env_conf.write_text("max-connections 123\nfeed-rate 7\n")
    flag_conf = tmp_path / "flag.conf"
    flag_conf.write_text("max-connections 456\n")
    got = config_lines(serve("--print-config", env={"TERN_CONFIG": str(env_conf)}).stdout)
    assert got["max-connections"] == ["123"] and got["feed-rate"] == ["7"]
    got = config_lines(serve("--config", str(flag_conf), "--print-config",
                             env={"TERN_CONFIG": str(env_conf)}).stdout)
    assert got["max-connections"] == ["456"] and got["feed-rate"] == ["40"]   # env's file unread
    r = serve("--print-config", env={"TERN_CONFIG": str(tmp_path / "none.conf")})
    assert r.returncode == 2 and "none.conf: No such file" in r.stderr, r.stderr


def start_and_stop(*args, env=None):
    """tern serve started with args until its "listening on" line, then
    SIGTERM (exit 0): its stderr's lines before that one."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TERN_") or k == "TERN_BIN"}
    e.update(env or {})
    p = subprocess.Popen([TERN_BIN, "serve", "--port", "0", "--threads", "1", *args],
                         stderr=subprocess.PIPE, env=e, text=True)
    before = []
    try:
        for line in p.stderr:
            if "listening on" in line:
                break
            before.append(line)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0
    return before


def test_a_misspelt_environment_variable_is_named_at_start():
    warned = start_and_stop("--admin-listen", "off", env={
        "TERN_MAX_CONECTIONS": "5", "TERN_NONSENSE_WORD": "1",
        # read by tern or its tests, or an option's: no warning
        "TERN_IO": "epoll", "TERN_SANITIZED": "1", "TERN_SOAK_SEED": "1", "TERN_FEED_RATE": "5"})
    assert len(warned) == 2, warned
    assert any("TERN_MAX_CONECTIONS" in w and "did you mean TERN_MAX_CONNECTIONS, "
               "--max-connections?" in w for w in warned), warned
    assert any("TERN_NONSENSE_WORD" in w and "did you mean" not in w for w in warned), warned


def test_a_misspelt_flag_names_the_nearest():
    r = serve("--max-conections", "3")
    assert r.returncode == 2
    assert "unknown option '--max-conections' (did you mean --max-connections?)" in r.stderr


@pytest.mark.parametrize("cmd", [["--version"], ["version"], ["serve", "--version"]])
def test_version(cmd):
    r = subprocess.run([TERN_BIN, *cmd], capture_output=True, text=True, timeout=10 * SLOW)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"tern \d+\.\d+\.\d+", lines[0]), lines
    assert lines[1].startswith("TLS: ") and ("OpenSSL" in lines[1] or "rustls" in lines[1])
    assert lines[2].startswith("I/O back ends: epoll"), lines


def help_options():
    out = serve("--help").stdout
    return re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", out, flags=re.M)


def test_the_manual_page_renders_and_names_every_option():
    page = os.path.join(os.path.dirname(TERN_BIN), "tern.1")
    assert os.path.exists(page), "the build writes tern.1 beside tern"
    with open(page) as f:
        assert f.read() == subprocess.run([TERN_BIN, "man"], capture_output=True, text=True,
                                          check=True).stdout
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-P", "-c", page],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = re.sub(r".\x08", "", r.stdout)   # bold and underline by overstriking
    text = text.replace("\u2010", "-").replace("\u2212", "-")
    text = re.sub(r"-\n\s*", "-", text)   # words broken at a hyphen
    opts = help_options()
    assert len(opts) > 60
    for name in opts:
        assert f"--{name}" in text, name
    for section in ("NAME", "SYNOPSIS", "OPTIONS", "ENVIRONMENT", "SIGNALS"):
        assert re.search(rf"^{section}", text, flags=re.M), section
    if subprocess.run(["sh", "-c", "command -v man"], capture_output=True).returncode == 0:
        r = subprocess.run(["man", "-l", page], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="100"))
        text = re.sub(r".\x08", "", r.stdout).replace("\u2010", "-").replace("\u2212", "-")
        assert r.returncode == 0 and "--max-connections" in text, r.stderr


# ---- the admin listener away from loopback (#37) -----------------------------

def test_admin_listen_off_loopback_is_refused_unless_allowed():
    r = serve("--port", "0", "--threads", "1", "--admin-listen", "0.0.0.0:0")
    assert r.returncode == 2
    assert "--admin-listen 0.0.0.0:0 is not a loopback address" in r.stderr, r.stderr
    assert "--admin-listen-public" in r.stderr
    out = start_and_stop("--admin-listen", "0.0.0.0:0", "--admin-listen-public", "--quiet")
    warning = [l for l in out if "WARNING" in l]
    assert len(warning) == 1, out
    for exposed in ("/stats", "/metrics", "not on loopback", "no key"):
        assert exposed in warning[0], warning
    # loopback, in any spelling, is quiet
    for at in ("127.0.0.1:0", "[::1]:0", "localhost:0", "127.1.2.3:0"):
        out = start_and_stop("--admin-listen", at)
        assert not [l for l in out if "WARNING" in l], (at, out)


# ---- SIGHUP says what it reloaded (#37) ---------------------------------------

def test_sighup_without_certificates_does_not_say_they_were_reloaded(tmp_path):
    conf = tmp_path / "tern.conf"
    conf.write_text("log-level info\n")
    p, lines, port = serve_with_config_only(conf)
    try:
        p.send_signal(signal.SIGHUP)
        lines.wait(r"SIGHUP: .*tern\.conf read")   # the certificates' line came after it
        time.sleep(0.3)
        rest = []
        while not lines.q.empty():
            rest.append(lines.q.get())
        assert not [l for l in rest if "certificates" in l], rest
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10 * SLOW) == 0


PACKAGED_CONF = os.path.join(os.path.dirname(__file__), "..", "..", "packaging", "tern.conf")


def test_the_packaged_configuration_is_production_shaped():
    # Issue #37: tern.service runs with packaging/tern.conf, which parses
    # and turns the demo off (no feed, no page), closes the feed's topics
    # to anonymous clients, keeps the admin listener on loopback and sets
    # the limits.
    r = serve("--config", PACKAGED_CONF, "--print-config")
    assert r.returncode == 0, r.stderr
    got = config_lines(r.stdout)
    assert got["feed"] == ["off"] and got["page"] == ["off"], got
    assert got["admin-listen"][0].startswith("127.0.0.1:"), got
    assert "topic market subscribe=token publish=none" in r.stdout
    assert "topic stats subscribe=token publish=none" in r.stdout
    for limit in ("max-connections", "max-connections-per-ip", "pubsub-rate"):
        assert int(got[limit][0]) > 0, (limit, got)
    service = open(os.path.join(os.path.dirname(PACKAGED_CONF), "tern.service")).read()
    assert re.search(r"^ExecStart=\S+ serve --config /etc/tern/tern.conf\b", service, re.M)


def test_the_packaged_configuration_serves_no_demo(tern_factory, tmp_path):
    # Started with it (ports and the token key from flags, which win over
    # the file): / is 404, and the feed's topics want a token.
    import json
    import urllib.error
    import urllib.request
    from websockets.sync.client import connect
    key = tmp_path / "token.pem"
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out",
                    str(tmp_path / "k.pem")], check=True, capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(tmp_path / "k.pem"), "-pubout", "-out", str(key)],
                   check=True, capture_output=True)
    t = tern_factory("--config", PACKAGED_CONF, "--token-public-key-file", str(key),
                     bench_routes=False, open_topics=False)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{t.base}/", timeout=5 * SLOW)
    assert e.value.code == 404
    with connect(f"ws://127.0.0.1:{t.port}/pubsub") as ws:
        for topic in ("market", "stats"):
            ws.send(json.dumps({"op": "subscribe", "topic": topic}))
            answer = json.loads(ws.recv(timeout=5 * SLOW))
            assert "error" in answer and answer.get("ok") != "subscribe", answer
