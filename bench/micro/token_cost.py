#!/usr/bin/env python3
"""What a token costs a connect-and-subscribe on tern serve's /pubsub.

Starts build/tern (or TERN_BIN) six ways: anonymous (a --topic rule opens
the topic), and with an HS256 secret, an RS256 key and an ES256 key (the
topic opened only by the token's rights), the public-key ones both with a
token each connection brings again (a reconnecting client: its signature
is remembered) and with fresh ones (each verified). Each round, for each server in
turn, CONC clients open N WebSockets one after another: the upgrade (with
?token=), {"op":"subscribe","topic":"orders.u1"}, its ack, a close
handshake. The figure is the server's CPU (user + system, from
/proc/PID/stat) per connect-and-subscribe, and the wall time per one; the
ratio is against the anonymous server of the same round. Rounds alternate
the servers so that drift on a shared machine falls on all of them.

    bench/micro/token_cost.py [--rounds 3] [--n 6000] [--conc 16]

Standard library and the openssl command only (keys and signatures)."""
import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TERN = os.environ.get("TERN_BIN") or os.path.join(ROOT, "build", "tern")
TOPIC = "orders.u1"
TICK = os.sysconf("SC_CLK_TCK")


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def der_to_raw(der):
    """An ECDSA signature from DER (what openssl writes) to JWT's r || s."""
    def integer(b, i):
        assert b[i] == 2
        n = b[i + 1]
        return int.from_bytes(b[i + 2:i + 2 + n], "big"), i + 2 + n
    i = 2 if der[1] < 0x80 else 3
    r, i = integer(der, i)
    s, _ = integer(der, i)
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def make_token(alg, key, sub="bench"):
    head = b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    claims = {"sub": sub, "exp": int(time.time()) + 3600,
              "tern": {"subscribe": [TOPIC], "publish": []}}
    signed = f"{head}.{b64(json.dumps(claims).encode())}".encode()
    if alg == "HS256":
        import hashlib
        import hmac
        sig = hmac.new(key, signed, hashlib.sha256).digest()
    else:
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signed,
                             capture_output=True, check=True).stdout
        if alg == "ES256":
            sig = der_to_raw(sig)
    return f"{signed.decode()}.{b64(sig)}"


def setups(d, fresh):
    """name -> (server flags, the tokens the clients take in turn: [None]
    for none). "again": every connection brings the same token (a client
    that reconnects); "fresh": fresh tokens, more than the server's
    per-thread cache of verified signatures holds, so each is verified."""
    secret = os.path.join(d, "secret")
    with open(secret, "wb") as f:
        f.write(b"bench-secret-0123456789abcdef")
    hs = b"bench-secret-0123456789abcdef"
    out = {"anonymous": (["--topic", "orders.* subscribe=anyone"], [None]),
           "HS256, fresh": (["--token-hmac-secret-file", secret],
                            [make_token("HS256", hs, f"u{i}") for i in range(fresh)])}
    for alg, gen in (("RS256", ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
                     ("ES256", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])):
        key, pub = os.path.join(d, alg + ".key"), os.path.join(d, alg + ".pub")
        subprocess.run(["openssl", "genpkey", *gen, "-out", key], check=True, capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True,
                       capture_output=True)
        out[alg + ", again"] = (["--token-public-key-file", pub], [make_token(alg, key)])
        out[alg + ", fresh"] = (["--token-public-key-file", pub],
                                [make_token(alg, key, f"u{i}") for i in range(fresh)])
    return out


def start(flags):
    p = subprocess.Popen([TERN, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
                          "--feed", "off", "--admin-listen", "off", "--max-connections-per-ip",
                          "0", "--pubsub-rate", "0", "--quiet", *flags],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = p.stderr.readline().decode()
    m = re.search(r"127\.0\.0\.1:(\d+)/", line)
    if not m:
        p.kill()
        sys.exit(f"tern did not start: {line!r}")
    return p, int(m.group(1))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def frame(payload):
    """A masked client text frame (mask 0: the payload as it is)."""
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload), 0, 0, 0, 0]) + payload


SUB = frame(json.dumps({"op": "subscribe", "topic": TOPIC}).encode())
CLOSE = bytes([0x88, 0x82, 0, 0, 0, 0, 0x03, 0xE8])


async def one(port, token):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    q = f"?token={token}" if token else ""
    w.write((f"GET /pubsub{q} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
             "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
             "Sec-WebSocket-Version: 13\r\n\r\n").encode() + SUB)
    head = await r.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(head.decode(errors="replace"))
    hdr = await r.readexactly(2)
    ack = json.loads(await r.readexactly(hdr[1] & 0x7F))
    if ack.get("ok") != "subscribe":
        raise RuntimeError(ack)
    w.write(CLOSE)
    await r.readexactly(4)   # the close echoed: 0x88 0x02 + code
    w.close()
    await w.wait_closed()


async def drive(port, tokens, n, conc):
    left = [n]

    async def worker():
        while left[0] > 0:
            left[0] -= 1
            await one(port, tokens[left[0] % len(tokens)])
    await asyncio.gather(*(worker() for _ in range(conc)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--fresh", type=int, default=300, help="distinct tokens of the fresh rows")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cfg = setups(d, a.fresh)
        servers = {name: start(flags) for name, (flags, _) in cfg.items()}
        try:
            for name, (p, port) in servers.items():   # warm up each
                asyncio.run(drive(port, cfg[name][1], 500, a.conc))
            cpu = {name: [] for name in cfg}
            wall = {name: [] for name in cfg}
            for _ in range(a.rounds):
                for name, (p, port) in servers.items():
                    c0, t0 = cpu_seconds(p.pid), time.monotonic()
                    asyncio.run(drive(port, cfg[name][1], a.n, a.conc))
                    cpu[name].append((cpu_seconds(p.pid) - c0) / a.n * 1e6)
                    wall[name].append((time.monotonic() - t0) / a.n * 1e6)
        finally:
            for p, _ in servers.values():
                p.terminate()
                p.wait()
    base = statistics.median(cpu["anonymous"])
    print(f"connect + subscribe + close on /pubsub, {a.rounds} rounds of {a.n} "
          f"({a.conc} at a time), server CPU per connection (median, min-max):")
    print("| token | server CPU µs | range | ratio to anonymous | wall µs |")
    print("|---|---:|---:|---:|---:|")
    for name in cfg:
        m = statistics.median(cpu[name])
        print(f"| {name} | {m:.1f} | {min(cpu[name]):.1f}-{max(cpu[name]):.1f} | "
              f"{m / base:.3f} | {statistics.median(wall[name]):.0f} |")


if __name__ == "__main__":
    main()
