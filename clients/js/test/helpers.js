// What the client's tests share: a real `tern serve` (TERN_BIN, else the
// repo's build/tern) started as tests/integration/conftest.py starts it
// (127.0.0.1, port 0, --bench-routes, an admin listener, the per-client
// limits off), tokens signed with its HMAC secret, and a TCP proxy between
// the two that the tests cut, delay and point at another server.
import { spawn } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { TernClient } from "../tern-client.js";

const here = dirname(fileURLToPath(import.meta.url));
export const TERN_BIN = process.env.TERN_BIN || resolve(here, "../../../build/tern");
// Slower under the sanitizers, as the python tests' SLOW.
export const SLOW = process.env.TERN_SANITIZED ? 4 : 1;

export const SECRET = "client-test-secret";

const running = new Set();   // how to stop each server and proxy started
// Every topic the tests use starts with this; the tokens give rights to it.
export const PREFIX = "t.";

const b64url = (b) => Buffer.from(b).toString("base64url");

/** A HS256 JWT for user `sub` with `ttl` seconds to live and rights over PREFIX*; info: its info claim. */
export function mintToken({ ttl = 3600, publish = [PREFIX + "*"], subscribe = [PREFIX + "*"],
                            secret = SECRET, sub = "client-test", info } = {}) {
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const claims = { sub, exp: Math.floor(Date.now() / 1000) + ttl, tern: { publish, subscribe } };
  if (info !== undefined) claims.info = info;
  const body = b64url(JSON.stringify(claims));
  const sig = createHmac("sha256", secret).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

/**
 * Starts `tern serve` with tokens on; resolves with {port, url, stop()}.
 * The rate limit is off unless defaultRate (then --pubsub-rate's default).
 */
export function startServer(args = [], { port = 0, defaultRate = false } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "tern-client-test-"));
  writeFileSync(join(dir, "secret"), SECRET + "\n");
  const apiKey = randomBytes(16).toString("hex");
  writeFileSync(join(dir, "api-key"), apiKey + "\n");
  const argv = ["serve", "--host", "127.0.0.1", "--port", String(port), "--threads", "1",
                "--bench-routes", "--admin-listen", "127.0.0.1:0",
                "--api-key-file", join(dir, "api-key"),
                "--max-connections", "0", "--max-connections-per-ip", "0",
                ...(defaultRate ? [] : ["--pubsub-rate", "0"]),
                "--token-hmac-secret-file", join(dir, "secret"),
                // a token expires at its exp, not 30 s later: the tests
                // of the expiry close (4001) wait for it
                "--token-leeway", "0", ...args];
  const proc = spawn(TERN_BIN, argv, { stdio: ["ignore", "ignore", "pipe"] });
  return new Promise((resolve, reject) => {
    // Stops the server and removes its key files (once it has exited: it
    // reads them again on SIGHUP). A server that has not exited 20 s
    // after SIGTERM is killed and the stop fails: a drain that never ends
    // is a bug, never a test run that hangs.
    const stop = () => new Promise((done, fail) => {
      let killer = null;
      const end = () => {
        clearTimeout(killer);
        rmSync(dir, { recursive: true, force: true });
        if (killer === "killed") fail(new Error("tern serve did not exit within 20 s of SIGTERM"));
        else done();
      };
      if (proc.exitCode !== null || proc.signalCode !== null) return end();
      proc.once("exit", end);
      proc.kill("SIGTERM");
      killer = setTimeout(() => {
        killer = "killed";
        proc.kill("SIGKILL");
      }, 20000 * SLOW);
    });
    running.add(stop);
    let err = "";
    const onData = (chunk) => {
      err += chunk;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)\//.exec(err);
      if (!m) return;
      proc.stderr.off("data", onData);
      proc.stderr.resume();   // keep draining it
      const p = Number(m[1]);
      const admin = /\(admin http:\/\/127\.0\.0\.1:(\d+)\/\)/.exec(err);
      resolve({
        port: p,
        url: `ws://127.0.0.1:${p}/pubsub`,
        // the admin listener and its key, for the server API
        adminUrl: admin ? `http://127.0.0.1:${admin[1]}` : null,
        apiKey,
        proc,
        stop,
      });
    };
    proc.stderr.on("data", onData);
    proc.once("exit", (code) => reject(new Error(`tern serve exited ${code}: ${err}`)));
  });
}

/**
 * A TCP proxy on 127.0.0.1 to target's port. cut() resets every
 * connection through it; down = true refuses new ones (reset at once);
 * delayMs(): the delay added to each chunk, each direction kept in order.
 */
export class Proxy {
  constructor(targetPort) {
    this.targetPort = targetPort;
    this.down = false;
    this.delayMs = () => 0;
    this.pairs = new Set();
    this.accepted = 0;
    this.acceptedAt = [];   // Date.now() of each connection taken
    this.server = net.createServer((client) => this._accept(client));
  }

  listen() {
    running.add(() => this.close());
    return new Promise((r) => this.server.listen(0, "127.0.0.1", () => {
      this.port = this.server.address().port;
      this.url = `ws://127.0.0.1:${this.port}/pubsub`;
      r(this);
    }));
  }

  _accept(client) {
    this.accepted++;
    this.acceptedAt.push(Date.now());
    if (this.down) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(this.targetPort, "127.0.0.1");
    const pair = { client, upstream };
    this.pairs.add(pair);
    // Each direction is a queue of chunks, each due at its arrival plus
    // its delay and never before the one ahead of it: one timer at a time
    // writes them in order (timers of different lengths may fire in any
    // order among themselves, which would reorder the stream).
    const pipe = (from, to) => {
      const queue = [];   // [due, chunk], due rising
      let timer = null;
      const pump = () => {
        timer = null;
        while (queue.length && queue[0][0] <= Date.now()) {
          const [, chunk] = queue.shift();
          if (!to.destroyed) to.write(chunk);
        }
        if (queue.length) timer = setTimeout(pump, queue[0][0] - Date.now());
      };
      from.on("data", (chunk) => {
        const last = queue.length ? queue[queue.length - 1][0] : 0;
        queue.push([Math.max(last, Date.now() + this.delayMs()), chunk]);
        if (!timer) pump();
      });
    };
    pipe(client, upstream);
    pipe(upstream, client);
    const end = () => {
      this.pairs.delete(pair);
      if (!client.destroyed) client.resetAndDestroy();
      if (!upstream.destroyed) upstream.resetAndDestroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  }

  /** Resets every connection through the proxy now. */
  cut() {
    for (const { client, upstream } of [...this.pairs]) {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
    }
    this.pairs.clear();
  }

  close() {
    this.cut();
    if (!this.server.listening) return Promise.resolve();
    return new Promise((r) => this.server.close(() => r()));
  }
}

/**
 * A proxy on 127.0.0.1 to target's port that refuses every WebSocket
 * upgrade (403), as a company proxy that blocks WebSockets does, and
 * passes the rest on. refused counts the upgrades it refused; cut()
 * resets every connection through it.
 */
export class NoUpgradeProxy {
  constructor(targetPort) {
    this.targetPort = targetPort;
    this.refused = 0;
    this.socks = new Set();
    this.server = net.createServer((client) => this._accept(client));
  }

  listen() {
    running.add(() => this.close());
    return new Promise((r) => this.server.listen(0, "127.0.0.1", () => {
      this.port = this.server.address().port;
      this.url = `ws://127.0.0.1:${this.port}/pubsub`;
      r(this);
    }));
  }

  _accept(client) {
    // every connection, piped or not yet (or refused, half-closed), is
    // cut by cut(): server.close() waits for them all
    this.socks.add(client);
    client.on("close", () => this.socks.delete(client));
    let head = Buffer.alloc(0);
    const first = (chunk) => {
      head = Buffer.concat([head, chunk]);
      if (!head.includes("\r\n\r\n")) return;
      client.off("data", first);
      if (/^upgrade:\s*websocket/im.test(head.toString("latin1"))) {
        this.refused++;
        client.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
      }
      const upstream = net.connect(this.targetPort, "127.0.0.1");
      this.socks.add(upstream);
      upstream.write(head);
      client.pipe(upstream);
      upstream.pipe(client);
      const end = () => {
        for (const s of [client, upstream]) {
          this.socks.delete(s);
          if (!s.destroyed) s.resetAndDestroy();
        }
      };
      client.on("error", end).on("close", end);
      upstream.on("error", end).on("close", end);
    };
    client.on("data", first).on("error", () => {});
  }

  cut() {
    for (const s of [...this.socks]) s.resetAndDestroy();
    this.socks.clear();
  }

  close() {
    this.cut();
    if (!this.server.listening) return Promise.resolve();
    return new Promise((r) => this.server.close(() => r()));
  }
}

// The retry waits clients ask for: random is a client's `random` option
// (Math.random, each draw kept); onAsk(ms, draw) is called with the wait
// the client asks for after a draw (the first setTimeout after it, its
// retry timer) and that draw. Asserting the wait asked, not when the timer
// fired, keeps a busy machine (which only makes timers late) from failing a
// test. restore() puts setTimeout back.
export function retryTimers(onAsk) {
  const real = globalThis.setTimeout;
  let draw = null;
  globalThis.setTimeout = (fn, ms, ...rest) => {
    if (draw !== null) {
      onAsk(ms, draw);
      draw = null;
    }
    return real(fn, ms, ...rest);
  };
  return {
    random: () => (draw = Math.random()),
    restore: () => { globalThis.setTimeout = real; },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Resolves once cond() is true (checked every 10 ms), or rejects naming what. */
export async function until(cond, what, ms = 5000) {
  const deadline = Date.now() + ms * SLOW;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** Resolves with the next "state" event equal to s. */
export function nextState(client, s) {
  return new Promise((r) => {
    const off = client.on("state", (now) => {
      if (now === s) {
        off();
        r();
      }
    });
  });
}

const made = new Set();

/** A TernClient that closeAll() closes: a failed test leaves none retrying (and the run hanging). */
export function newClient(url, options) {
  const c = new TernClient(url, options);
  made.add(c);
  return c;
}

export function closeAll() {
  for (const c of made) c.close();
  made.clear();
}

/**
 * Stops every server and proxy started (a test that failed half-way leaves
 * none), then checks that nothing else is left open: a timer or a socket
 * the client kept after close() would keep the test file's process, and so
 * the whole run, alive for ever. Fails naming what is left.
 */
export async function stopAll() {
  const all = [...running];
  running.clear();
  await Promise.all(all.map((stop) => stop()));
  const deadline = Date.now() + 3000 * SLOW;
  let left;
  while ((left = leftOpen()).length > 0 && Date.now() < deadline) await sleep(20);
  if (left.length > 0) throw new Error(`left open after close(): ${left.join(", ")}`);
}

// What keeps this process alive besides its own pipes to the test runner
// (and the timer of a sleep() under way, none while this runs).
function leftOpen() {
  return process.getActiveResourcesInfo().filter((r) => r !== "PipeWrap" && r !== "TTYWrap");
}
