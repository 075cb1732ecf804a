// Presence and join/leave (a topic rule's presence=on, join-leave=on)
// through the client: presence(), presenceStats(), onJoin/onLeave and the
// "join"/"leave" events, against a real tern serve.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { TernError } from "../tern-client.js";
import { PREFIX, mintToken, startServer, until, closeAll, newClient, stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--topic", `${PREFIX}room.* presence=on join-leave=on`]);
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

const client = (sub, info) => newClient(srv.url, { token: mintToken({ sub, info }) });
const open = (c) => new Promise((r) => {
  if (c.state === "open") return r();
  const off = c.on("state", (s) => { if (s === "open") { off(); r(); } });
});

test("presence lists every client, users counted once, with the token's info", async () => {
  const topic = PREFIX + "room.list";
  const a1 = client("alice", { name: "Alice" }), a2 = client("alice", { name: "Alice" });
  const b = client("bob");
  for (const c of [a1, a2, b]) await c.subscribe(topic, () => {}).ready;
  const p = await b.presence(topic);
  assert.equal(p.topic, topic);
  assert.equal(p.clients, 3);
  assert.equal(p.users, 2);
  assert.equal(p.truncated, false);
  assert.deepEqual(p.presence.map((e) => e.user), ["alice", "alice", "bob"]);
  assert.deepEqual(p.presence[0].info, { name: "Alice" });
  assert.equal(p.presence[2].info, undefined);
  assert.equal(new Set(p.presence.map((e) => e.client)).size, 3);
  const one = await b.presence(topic, { limit: 1 });
  assert.equal(one.truncated, true);
  assert.equal(one.presence.length, 1);
  assert.deepEqual(await a1.presenceStats(topic), { topic, clients: 3, users: 2 });
});

test("presence is refused where the rule is off, and not asked while disconnected", async () => {
  const c = client("carol");
  await open(c);
  await assert.rejects(c.presence(PREFIX + "plain"),
    (e) => e instanceof TernError && e.code === "SERVER" && e.message === "presence off");
  await assert.rejects(c.presenceStats("elsewhere.room"),
    (e) => e instanceof TernError && e.code === "SERVER");
  const idle = newClient(srv.url, { token: mintToken(), connect: false });
  await assert.rejects(idle.presence(PREFIX + "room.x"),
    (e) => e instanceof TernError && e.code === "DISCONNECTED");
});

test("joins and leaves reach onJoin, onLeave and the client's events, once each", async () => {
  const topic = PREFIX + "room.events";
  const w = client("watcher");
  const joins = [], leaves = [], events = [];
  w.on("join", (ev) => events.push(["join", ev.user]));
  w.on("leave", (ev) => events.push(["leave", ev.user]));
  await w.subscribe(topic, () => {}, {
    onJoin: (ev) => joins.push(ev),
    onLeave: (ev) => leaves.push(ev),
  }).ready;
  const others = [];
  for (let i = 0; i < 5; i++) {
    const c = client(`u${i}`, { i });
    others.push({ c, sub: c.subscribe(topic, () => {}) });
  }
  await Promise.all(others.map((o) => o.sub.ready));
  await until(() => joins.length === 5, "five joins");
  assert.deepEqual(joins.map((e) => e.user).sort(), ["u0", "u1", "u2", "u3", "u4"]);
  assert.ok(joins.every((e) => e.topic === topic && e.info.i === Number(e.user.slice(1))));
  // Leaving: by unsubscribing, and by closing the client.
  others[0].sub.unsubscribe();
  for (const o of others.slice(1)) o.c.close();
  await until(() => leaves.length === 5, "five leaves");
  assert.deepEqual(new Set(leaves.map((e) => e.client)), new Set(joins.map((e) => e.client)));
  assert.equal(events.filter(([k]) => k === "join").length, 5);
  assert.equal(events.filter(([k]) => k === "leave").length, 5);
  assert.deepEqual(await w.presenceStats(topic), { topic, clients: 1, users: 1 });
});
