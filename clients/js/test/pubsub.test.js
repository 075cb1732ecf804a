// Subscribing, publishing with acks, refusals, snapshots and the per-key
// store, against a real tern serve.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { TernError } from "../tern-client.js";
import { PREFIX, mintToken, sleep, startServer, until, closeAll, newClient, stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--feed-rate", "400", "--pubsub-history", "1000"]);
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

const client = (opts = {}) => newClient(srv.url, { token: mintToken(), ...opts });

test("a publish resolves with the server's seq, and every subscriber gets it in order", async () => {
  const topic = PREFIX + "order";
  const a = client(), b = client();
  const got = { a: [], b: [] };
  const sa = a.subscribe(topic, (m) => got.a.push(m));
  const sb = b.subscribe(topic, (m) => got.b.push(m));
  await Promise.all([sa.ready, sb.ready]);
  const seqs = [];
  for (let i = 0; i < 50; i++) seqs.push(await a.publish(topic, `m${i}`));
  assert.deepEqual(seqs, Array.from({ length: 50 }, (_, i) => i + 1));
  await until(() => got.b.length === 50 && got.a.length === 50, "50 messages each");
  for (const g of [got.a, got.b]) {
    assert.deepEqual(g.map((m) => m.data), seqs.map((_, i) => `m${i}`));
    assert.deepEqual(g.map((m) => m.seq), seqs);
    assert.ok(g.every((m) => m.topic === topic && m.snapshot === false));
  }
  // publishes sent together are acked in order too
  const many = await Promise.all(Array.from({ length: 20 }, (_, i) => b.publish(topic, `n${i}`)));
  assert.deepEqual(many, Array.from({ length: 20 }, (_, i) => 51 + i));
  await until(() => got.a.length === 70, "a's 70th");
  sa.unsubscribe();
  await b.publish(topic, "after");
  await until(() => got.b.length === 71, "b's 71st");
  assert.equal(got.a.length, 70, "nothing after unsubscribe");
  a.close();
  b.close();
});

test("a publish that is not allowed is refused at once, and the connection goes on", async () => {
  const c = client({ token: mintToken({ publish: [PREFIX + "mine.*"] }) });
  await new Promise((r) => c.on("state", (s) => s === "open" && r()));
  const t0 = Date.now();
  await assert.rejects(c.publish(PREFIX + "other", "x"),
    (e) => e instanceof TernError && e.code === "SERVER" && e.message === "forbidden");
  assert.ok(Date.now() - t0 < 1000);
  assert.ok(await c.publish(PREFIX + "mine.x", "y") >= 1);   // allowed
  // a subscribe refused: ready rejects, an error event says so
  const errors = [];
  c.on("error", (e) => errors.push(e));
  const s = c.subscribe("elsewhere", () => {});
  await assert.rejects(s.ready, (e) => e.code === "SUBSCRIBE" && /forbidden/.test(e.message));
  assert.equal(errors.length, 1);
  assert.equal(c.state, "open");
  c.close();
  await assert.rejects(c.publish(PREFIX + "mine.x", "z"), (e) => e.code === "CLOSED");
});

test("a subscription starts with the latest message of each key, and keeps them", async () => {
  const topic = PREFIX + "board";
  const pub = client();
  for (let i = 0; i < 30; i++) await pub.publish(topic, `v${i}`, { key: `k${i % 6}` });
  const c = client();
  const got = [];
  let info;
  const s = c.subscribe(topic, (m) => got.push(m), { onSubscribed: (i) => { info = i; } });
  await s.ready;
  assert.equal(info.replayed, 6);
  assert.equal(info.gap, false);
  await until(() => got.length === 6, "the snapshot");
  assert.deepEqual(got.map((m) => [m.key, m.data, m.snapshot]),
    [0, 1, 2, 3, 4, 5].map((k) => [`k${k}`, `v${24 + k}`, true]));
  assert.deepEqual([...s.latest.keys()].sort(), ["k0", "k1", "k2", "k3", "k4", "k5"]);
  // then live, not marked, and the store follows
  assert.equal(await pub.publish(topic, "new", { key: "k2" }), 31);
  await until(() => got.length === 7, "the live one");
  assert.deepEqual([got[6].seq, got[6].snapshot], [31, false]);
  assert.equal(s.latest.get("k2").data, "new");
  // without a snapshot: only what comes next
  const d = client();
  const none = [];
  await d.subscribe(topic, (m) => none.push(m), { snapshot: false }).ready;
  await pub.publish(topic, "x", { key: "k9" });
  await until(() => none.length === 1, "d's live one");
  assert.equal(none[0].data, "x");
  for (const x of [pub, c, d]) x.close();
});

test("sub.latest holds the whole snapshot at the first handler call", async () => {
  const topic = PREFIX + "whole";
  const pub = client();
  for (let i = 0; i < 40; i++) await pub.publish(topic, `v${i}`, { key: `k${i}` });
  const c = client();
  const sizes = [];
  let atSubscribed;
  const s = c.subscribe(topic, (m, sub) => sizes.push(sub.latest.size), {
    onSubscribed: (info, sub) => { atSubscribed = sub.latest.size; },
  });
  await s.ready;
  await until(() => sizes.length === 40, "the snapshot's 40");
  assert.equal(atSubscribed, 40, "whole already when onSubscribed runs");
  assert.deepEqual(sizes, new Array(40).fill(40), "whole at every handler call, the first too");
  // each message is the one latest holds for its key
  assert.equal(s.latest.get("k7").data, "v7");
  assert.equal(s.latest.get("k7").snapshot, true);
  for (const x of [pub, c]) x.close();
});

test("the feed's snapshot has every instrument at once", async () => {
  await sleep(1000);   // 400 updates a second over 24 instruments: each has moved
  const c = newClient(srv.url);   // anonymous: market is open
  const sizes = [];
  const s = c.subscribe("market", (m, sub) => sizes.push(sub.latest.size));
  const info = await s.ready;
  assert.equal(info.replayed, 24);
  assert.equal(s.latest.size, 24);
  const syms = [...s.latest.values()].map((m) => JSON.parse(m.data).sym);
  assert.deepEqual(syms.slice().sort(), [...s.latest.keys()].sort());
  await until(() => sizes.length >= 24, "the snapshot's handler calls");
  assert.equal(sizes[0], 24, "every instrument at the first handler call");
  c.close();
});
