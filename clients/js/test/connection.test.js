// Tokens (refreshed before exp, again after a refusal), the backoff's
// jitter, the queue of publishes while disconnected, and a clean close.
import assert from "node:assert/strict";
import net from "node:net";
import { after, afterEach, before, test } from "node:test";

import { TernClient, backoffDelay, tokenExp } from "../tern-client.js";
import { PREFIX, Proxy, SLOW, mintToken, retryTimers, sleep, startServer, until, closeAll, newClient,
  stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--feed", "off", "--pubsub-history", "1000"]);
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

test("getToken is asked again before exp, and the connection outlives the first token", async () => {
  const asked = [];
  const c = newClient(srv.url, {
    getToken: async () => {
      asked.push(Date.now());
      return mintToken({ ttl: 3 });   // the server closes with 4001 at exp without a refresh
    },
  });
  const closes = [];
  c.on("error", (e) => closes.push(e.code));
  const got = [];
  const s = c.subscribe(PREFIX + "tok", (m) => got.push(m.data));
  await s.ready;
  const pub = newClient(srv.url, { token: mintToken() });
  await sleep(4500);   // past the first token's exp
  assert.ok(asked.length >= 2, `getToken asked ${asked.length} times`);
  // refreshed about half-way through its 3 s (refreshMargin is capped at half)
  assert.ok(asked[1] - asked[0] >= 1000 && asked[1] - asked[0] <= 2500, `${asked[1] - asked[0]} ms`);
  assert.deepEqual(closes, [], "never closed for its token");
  await pub.publish(PREFIX + "tok", "still here");
  await until(() => got.length === 1, "a message on the same connection");
  c.close();
  pub.close();
});

test("a refused token (401) is replaced by asking getToken again", async () => {
  const tokens = ["not.a.token", mintToken()];
  let asked = 0;
  const c = newClient(srv.url, { getToken: async () => tokens[Math.min(asked++, 1)],
                                      backoffInitial: 10, backoffMax: 50 });
  await new Promise((r) => c.on("state", (st) => st === "open" && r()));
  assert.equal(asked, 2);
  c.close();
});

test("an expired token closes with 4001; the client gets a new one and comes back", async () => {
  let asked = 0;
  const c = newClient(srv.url, {
    // exp in 2 s, and a margin that refreshes too late to beat it
    getToken: async () => (asked++, mintToken({ ttl: 2 })),
    refreshMargin: -5000,
    backoffInitial: 10,
  });
  const errors = [];
  c.on("error", (e) => errors.push(e.code));
  await new Promise((r) => c.on("state", (st) => st === "open" && r()));
  await until(() => errors.includes("TOKEN_EXPIRED"), "the 4001 close", 5000);
  await until(() => c.state === "open" && asked >= 2, "back with a new token");
  c.close();
});

test("tokenExp reads a JWT's exp, and nothing else", () => {
  const t = mintToken({ ttl: 100 });
  assert.ok(Math.abs(tokenExp(t) - (Date.now() / 1000 + 100)) < 5);
  assert.equal(tokenExp("nope"), undefined);
  assert.equal(tokenExp("a.b.c"), undefined);
});

test("backoff: full jitter, under the exponential ceiling and the cap", () => {
  // the ends of random()'s range
  assert.equal(backoffDelay(0, 100, 5000, () => 0), 0);
  assert.equal(backoffDelay(3, 100, 5000, () => 0.999999), 799);
  assert.equal(backoffDelay(20, 100, 5000, () => 0.999999), 4999);
  assert.equal(backoffDelay(1000, 100, 5000, () => 0.5), 2500);   // no overflow past the cap
  // spread over the whole window: 10 000 draws fill each tenth of it
  const ceiling = Math.min(5000, 100 * 2 ** 4);
  const tenths = new Array(10).fill(0);
  for (let i = 0; i < 10000; i++) {
    const d = backoffDelay(4, 100, 5000);
    assert.ok(d >= 0 && d < ceiling);
    tenths[Math.floor((d / ceiling) * 10)]++;
  }
  assert.ok(tenths.every((n) => n > 800 && n < 1200), tenths.join(" "));
});

test("reconnect attempts wait within the jittered bounds while the server is away", async () => {
  const proxy = await new Proxy(srv.port).listen();
  proxy.down = true;
  // The wait the client asks for after each draw (its retry timer),
  // asserted exactly.
  const draws = [], asked = [];
  const timers = retryTimers((ms, draw) => {
    asked.push(ms);
    draws.push(draw);
  });
  let c;
  try {
    c = newClient(proxy.url, {
      token: mintToken(), backoffInitial: 40, backoffMax: 300, random: timers.random,
    });
    await until(() => proxy.accepted >= 7, "7 attempts", 10000);
    c.close();
  } finally {
    timers.restore();
  }
  const attempts = proxy.accepted;
  // Attempt k+1 came draws[k] * min(300, 40 * 2^k) ms after attempt k
  // failed: the ceilings double, then stay at the cap, and the waits are
  // the draws' share of them. A timer is never early, so the gap between
  // two attempts is at least that wait (it is later on a busy machine).
  const at = proxy.acceptedAt;
  for (let k = 0; k + 1 < attempts; k++) {
    const want = backoffDelay(k, 40, 300, () => draws[k]);
    assert.ok(want < Math.min(300, 40 * 2 ** k));
    assert.equal(asked[k], want, `attempt ${k + 1}: the client waited ${asked[k]} ms, drawn ${want}`);
    const gap = at[k + 1] - at[k];
    assert.ok(gap >= want - 2, `attempt ${k + 1}: ${gap} ms after the one before, drawn ${want}`);
  }
  const states = [];
  c.on("state", (s) => states.push(s));
  await sleep(400);
  assert.equal(proxy.accepted, attempts, "no attempt after close");
  assert.deepEqual(states, []);
  assert.equal(c.state, "closed");
  await proxy.close();
});

test("publishes wait in a bounded queue while disconnected: reject-new", async () => {
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "queue";
  const c = newClient(proxy.url, { token: mintToken(), queueMax: 3, backoffInitial: 10,
                                        backoffMax: 50 });
  await until(() => c.state === "open", "open");
  proxy.down = true;
  proxy.cut();
  await until(() => c.state !== "open", "the drop seen");
  const held = [c.publish(topic, "q0"), c.publish(topic, "q1"), c.publish(topic, "q2")];
  const t0 = Date.now();
  await assert.rejects(c.publish(topic, "q3"), (e) => e.code === "QUEUE_FULL");
  assert.ok(Date.now() - t0 < 100, "refused at once");
  assert.equal(c.queued, 3);
  const got = [];
  const watcher = newClient(srv.url, { token: mintToken() });
  await watcher.subscribe(topic, (m) => got.push(m.data)).ready;
  proxy.down = false;
  const seqs = await Promise.all(held);
  assert.deepEqual(seqs, [seqs[0], seqs[0] + 1, seqs[0] + 2]);
  await until(() => got.length === 3, "the three");
  assert.deepEqual(got, ["q0", "q1", "q2"]);
  c.close();
  watcher.close();
  await proxy.close();
});

test("drop-oldest makes room by refusing the oldest; close refuses what is left", async () => {
  const c = newClient(srv.url, { token: mintToken(), queueMax: 2,
                                      queuePolicy: "drop-oldest", connect: false });
  const p0 = c.publish(PREFIX + "q", "a");
  const p1 = c.publish(PREFIX + "q", "b");
  const p2 = c.publish(PREFIX + "q", "c");
  await assert.rejects(p0, (e) => e.code === "DROPPED");
  assert.equal(c.queued, 2);
  c.close();
  await assert.rejects(p1, (e) => e.code === "CLOSED");
  await assert.rejects(p2, (e) => e.code === "CLOSED");
  // queueMax 0: nothing is held
  const d = newClient(srv.url, { token: mintToken(), queueMax: 0, connect: false });
  await assert.rejects(d.publish(PREFIX + "q", "x"), (e) => e.code === "QUEUE_FULL");
  d.close();
  assert.throws(() => new TernClient(srv.url, { queuePolicy: "keep-all", connect: false }), TypeError);
});

test("close is clean: state closed, a 1000 close frame, no reconnect", async () => {
  const proxy = await new Proxy(srv.port).listen();
  const c = newClient(proxy.url, { token: mintToken(), backoffInitial: 10 });
  const states = [];
  c.on("state", (s) => states.push(s));
  await until(() => c.state === "open", "open");
  c.close();
  assert.equal(c.state, "closed");
  await sleep(200);
  assert.equal(proxy.accepted, 1);
  assert.deepEqual(states, ["open", "closed"]);
  assert.throws(() => c.subscribe(PREFIX + "x", () => {}), (e) => e.code === "CLOSED");
  await proxy.close();
});

test("a connection that fails before it opens is an error event (CONNECT): a refused port, a 401", async () => {
  // a port nobody listens on: taken, then given back
  const free = net.createServer();
  await new Promise((r) => free.listen(0, "127.0.0.1", r));
  const port = free.address().port;
  await new Promise((r) => free.close(r));
  const refused = newClient(`ws://127.0.0.1:${port}/pubsub`, { backoffInitial: 5000 });
  const errors = [];
  refused.on("error", (e) => errors.push(e));
  await until(() => errors.length === 1, "the refused connection's error");
  assert.equal(errors[0].code, "CONNECT");
  assert.match(errors[0].message, /ECONNREFUSED/);
  assert.equal(refused.state, "reconnecting");
  refused.close();
  // a token the server refuses: 401 on the upgrade
  const denied = newClient(srv.url, { token: "not.a.token", backoffInitial: 5000 });
  const derr = [];
  denied.on("error", (e) => derr.push(e));
  await until(() => derr.length === 1, "the 401's error");
  assert.equal(derr[0].code, "CONNECT");
  assert.equal(derr[0].detail.status, 401);
  assert.match(derr[0].message, /401/);
  denied.close();
});
