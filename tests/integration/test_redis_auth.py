"""--redis with a password (issue #27): AUTH after connecting, with
requirepass and with an ACL user, the password from the URL or from
--redis-password-file; a wrong one is a clear error, never shows the
password, and keeps /readyz at 503; README's ACL rights are enough, and
a user short of one (a history rule's PSUBSCRIBE pattern) is logged once
with NOPERM and backed off from. Against a real redis-server."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import types
import urllib.request

import pytest
from websockets.sync.client import connect

from conftest import SLOW, TERN_BIN, wait_for
from engines import Redis, free_port, http_publish, readyz, recv_data, subscribe

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server missing (scripts/install-deps.sh test)")

PASSWORD = "s3cret/p@ss:word%"   # characters a URL must escape
ENCODED = "s3cret%2Fp%40ss%3Aword%25"


class AuthRedis(Redis):
    """A redis-server with requirepass, and an ACL user "app"."""

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--requirepass", PASSWORD,
             "--user", "app", "on", f">{PASSWORD}-app", "~*", "&*", "+@all"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.command("AUTH", PASSWORD) == "+OK":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")


@pytest.fixture
def redis():
    r = AuthRedis(free_port())
    r.start()
    yield r
    r.stop()


def admin(redis, *args):
    """One command as the default user (after AUTH): the reply's first
    line, or the text of a bulk string reply."""
    with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
        req = "".join(f"*{len(c)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in c)
                      for c in (("AUTH", PASSWORD), args))
        s.sendall(req.encode())
        f = s.makefile("rb")
        assert f.readline() == b"+OK\r\n"
        line = f.readline().decode().rstrip("\r\n")
        if line.startswith("$") and line != "$-1":
            return f.read(int(line[1:]) + 2)[:-2].decode()
        return line


def connections(redis):
    """Redis's total_connections_received (this one included)."""
    info = admin(redis, "INFO", "stats")
    return int(re.search(r"total_connections_received:(\d+)", info).group(1))


# The rights README gives a tern user (its "ACL SETUSER" line), with the
# history rule 'chat.*' of the tests below: its PSUBSCRIBE pattern
# tern:chat.* needs a channel right of its own (Redis compares a
# PSUBSCRIBE's pattern with the user's literally).
TERN_ACL = ["resetchannels", "&tern:*", "&tern:chat.*", "resetkeys", "~tern:*", "-@all",
            "+ping", "+select", "+client|setname", "+subscribe", "+unsubscribe", "+psubscribe",
            "+publish", "+eval", "+evalsha", "+script|load", "+xrange", "+hmget", "+hincrby",
            "+hget", "+hset", "+hsetnx", "+hexists", "+del", "+xadd", "+pexpire"]


def client_list(redis):
    """CLIENT LIST, on a connection that authenticates first."""
    with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
        s.sendall(f"AUTH {PASSWORD}\r\nCLIENT LIST\r\n".encode())
        f = s.makefile("rb")
        assert f.readline() == b"+OK\r\n"
        n = int(f.readline()[1:])
        return f.read(n).decode()


def stats(node):
    with urllib.request.urlopen(f"{node.admin_base}/stats", timeout=5 * SLOW) as r:
        return json.loads(r.read())



def delivers_across(a, b):
    """A publish on a reaches b's subscriber (through Redis)."""
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        subscribe(ws, "auth")
        wait_for(lambda: stats(b)["redis"]["connected"], "b linked")
        time.sleep(0.3)   # b's SUBSCRIBE reaches Redis
        http_publish(a, "auth", "across")
        return recv_data(ws) == "across"


def test_requirepass_in_the_url(redis, tern_factory):
    url = f"redis://:{ENCODED}@127.0.0.1:{redis.port}/0"
    a = tern_factory("--redis", url)
    b = tern_factory("--redis", url)
    wait_for(lambda: readyz(a)[0] == 200 and readyz(b)[0] == 200, "both ready")
    assert delivers_across(a, b)


def test_acl_user_and_password_file(redis, tern_factory, tmp_path):
    f = tmp_path / "redis-pass"
    f.write_text(PASSWORD + "-app\n")
    os.chmod(f, 0o600)
    a = tern_factory("--redis", f"redis://app@127.0.0.1:{redis.port}",
                     "--redis-password-file", str(f))
    b = tern_factory("--redis", f"redis://app:{ENCODED}-app@127.0.0.1:{redis.port}")
    wait_for(lambda: readyz(a)[0] == 200 and readyz(b)[0] == 200, "both ready")
    assert delivers_across(a, b)
    # Every link of both nodes (two each) is the ACL user's.
    tern_links = [l for l in client_list(redis).splitlines() if "name=tern-" in l]
    assert len(tern_links) == 4, tern_links
    for line in tern_links:
        assert " user=app " in line, line


def serve(*args):
    """A tern serve of this test's own, whose whole stderr the test reads
    (conftest's buffered readline may read past its first line, and
    communicate() then never sees those bytes). Returns the process, its
    admin address and its first line."""
    p = subprocess.Popen([TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
                          "--admin-listen", "127.0.0.1:0", *args], stderr=subprocess.PIPE,
                         bufsize=0)   # unbuffered: readline takes no more than its line
    first = p.stderr.readline().decode()
    m = re.search(r"\(admin http://127\.0\.0\.1:(\d+)/\)", first)
    if not m:
        p.kill()
        raise AssertionError(f"tern did not start: {first!r}")
    return p, types.SimpleNamespace(admin_base=f"http://127.0.0.1:{m.group(1)}"), first


def stop(p, first):
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10 * SLOW)
    assert p.returncode == 0
    err = first + err.decode()
    assert "Sanitizer" not in err and "runtime error:" not in err, err
    return err


def test_wrong_password_is_said_and_never_shown(redis):
    p, a, first = serve("--redis", f"redis://:not-{ENCODED}@127.0.0.1:{redis.port}",
                        "--log-level", "info")
    try:
        wait_for(lambda: stats(a)["redis"]["auth_refused"], "auth refused")
        assert readyz(a) == (503, "not ready: bridge (redis) auth failed\n")
        assert stats(a)["redis"]["connected"] is False
        with urllib.request.urlopen(f"{a.admin_base}/metrics", timeout=5 * SLOW) as r:
            assert "\ntern_redis_auth_refused 1\n" in r.read().decode()
        time.sleep(0.5)   # a retry or two: still said once
    finally:
        err = stop(p, first)
    assert err.count("refused the password") == 1, err
    assert "WRONGPASS" in err, err
    assert "s3cret" not in err and "not-" not in err, err


def test_no_password_to_a_server_that_wants_one(redis):
    p, a, first = serve("--redis", f"redis://127.0.0.1:{redis.port}", "--feed", "off")
    try:
        # Redis answers NOAUTH; the bridge never says it is up, and says why.
        wait_for(lambda: stats(a)["redis"]["auth_refused"], "auth refused")
        assert stats(a)["redis"]["connected"] is False
        assert readyz(a) == (503, "not ready: bridge (redis) auth failed\n")
    finally:
        err = stop(p, first)
    assert "refused a client without a password" in err and "NOAUTH" in err, err


def test_a_bad_url_is_refused_without_showing_the_password():
    for bad in (f"redis://:{ENCODED}@", "redis://app@127.0.0.1", "redis://:@127.0.0.1",
                "redis://:%zz@127.0.0.1", f"redis://:{ENCODED}@127.0.0.1:70000"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1",
                            "--admin-listen", "off", "--redis", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode != 0, bad
        assert "--redis" in r.stderr, (bad, r.stderr)
        assert "s3cret" not in r.stderr, r.stderr


def test_password_file_with_a_password_in_the_url_too(tmp_path):
    f = tmp_path / "p"
    f.write_text("x\n")
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--admin-listen", "off",
                        "--redis", f"redis://:{ENCODED}@127.0.0.1", "--redis-password-file", str(f)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    assert "without a password" in r.stderr and "****" in r.stderr, r.stderr
    assert "s3cret" not in r.stderr


def test_the_documented_acl_rights_are_enough(redis, tern_factory):
    """A user with exactly README's rights: SELECT, both links, a topic
    without a history (SUBSCRIBE, PUBLISH) and one with (PSUBSCRIBE of its
    rule's pattern, the epoch's claim, numbering by EVALSHA, the last
    number); a fill's XRANGE is checked by ACL DRYRUN. Redis denied
    nothing (ACL LOG is empty: the check that sees every command) and
    neither node logged a refusal."""
    assert admin(redis, "ACL", "SETUSER", "tern", "on", ">pw-tern", *TERN_ACL) == "+OK"
    url = f"redis://tern:pw-tern@127.0.0.1:{redis.port}/1"
    rule = ["--feed", "off", "--topic", "chat.* subscribe=anyone publish=anyone history=100"]
    a = tern_factory("--redis", url, *rule)
    b = tern_factory("--redis", url, *rule, "--threads", "2")
    wait_for(lambda: readyz(a)[0] == 200 and readyz(b)[0] == 200, "both ready")
    assert delivers_across(a, b)
    with connect(f"ws://127.0.0.1:{b.port}/pubsub") as ws:
        ws.send(json.dumps({"op": "subscribe", "topic": "chat.room"}))
        ack = json.loads(ws.recv(timeout=5 * SLOW))   # before the first message: a claim
        assert ack["ok"] == "subscribe", ack
        a.publish("chat.room", "numbered")
        while True:
            m = json.loads(ws.recv(timeout=5 * SLOW))
            if "data" in m:
                break
        assert m["data"] == "numbered" and m["seq"] == 1, m
    assert admin(redis, "ACL", "DRYRUN", "tern", "XRANGE", "tern:s:chat.room", "0-1", "0-2") == "+OK"
    assert admin(redis, "ACL", "LOG") == "*0"
    for node in (a, b):
        node.stop()
        assert "refused" not in node.stderr and "NOPERM" not in node.stderr, node.stderr


def test_an_acl_user_without_a_pattern_right_is_said_once_and_backs_off(redis):
    """The channel right &tern:* does not cover the PSUBSCRIBE of the rule
    chat.* (tern:chat.*): Redis answers NOPERM and the link is dropped.
    That is logged once, with Redis's words, and the links, which come up
    at every try before the refusal, are tried again with a growing
    backoff: a handful of tries in 5 s, not one every 100 ms."""
    narrow = [r for r in TERN_ACL if r != "&tern:chat.*"]
    assert admin(redis, "ACL", "SETUSER", "narrow", "on", ">pw-narrow", *narrow) == "+OK"
    before = connections(redis)
    p, a, first = serve("--redis", f"redis://narrow:pw-narrow@127.0.0.1:{redis.port}",
                        "--feed", "off", "--topic", "chat.* subscribe=anyone history=100")
    try:
        time.sleep(5)
        links = connections(redis) - before - 1   # less the one asking
        assert stats(a)["redis"]["connected"] is False
    finally:
        err = stop(p, first)
    assert err.count("NOPERM") == 1, err
    assert "dropped the subscribing link after an error reply: NOPERM" in err, err
    assert links <= 2 * 10, links   # two links a try: under 10 tries (without backoff, ~50)
