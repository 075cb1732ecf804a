// The server's rate limit (--pubsub-rate, 100 a second by default): what a
// reconnect sends at once (every subscription, every queued publish) is
// paced to it, and nothing is lost to "rate limit".
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { PREFIX, Proxy, mintToken, startServer, until, closeAll, newClient, stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--feed", "off", "--pubsub-history", "1000"], { defaultRate: true });
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

const fast = { backoffInitial: 20, backoffMax: 200 };

test("150 subscriptions all come back after reconnect() against the default rate", async () => {
  const c = newClient(srv.url, { token: mintToken(), ...fast });
  const errors = [];
  c.on("error", (e) => errors.push(e));
  const topics = Array.from({ length: 150 }, (_, i) => `${PREFIX}many.${i}`);
  const got = new Map();      // topic -> the data of its messages
  const acks = new Map();     // topic -> its onSubscribed infos
  const subs = topics.map((t) => c.subscribe(t, (m) => got.get(t).push(m.data), {
    onSubscribed: (info) => acks.get(t).push(info),
  }));
  for (const t of topics) {
    got.set(t, []);
    acks.set(t, []);
  }
  await Promise.all(subs.map((s) => s.ready));
  c.reconnect();
  await until(() => topics.every((t) => acks.get(t).length === 2), "150 resubscriptions", 10000);
  assert.ok(topics.every((t) => acks.get(t)[1].resumed === true && !acks.get(t)[1].gap));
  // Two publishers, each within the burst its own connection starts with.
  const p1 = newClient(srv.url, { token: mintToken() });
  const p2 = newClient(srv.url, { token: mintToken() });
  await Promise.all(topics.map((t, i) => (i % 2 ? p1 : p2).publish(t, "after")));
  await until(() => topics.every((t) => got.get(t).length === 1), "a message on each of the 150", 10000);
  assert.ok(topics.every((t) => got.get(t)[0] === "after"));
  assert.deepEqual(errors.map((e) => e.code), [], "no subscription refused, no error");
  assert.equal(c.state, "open");
});

test("1000 publishes queued while disconnected all drain, paced, in order", async () => {
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "burst";
  const c = newClient(proxy.url, { token: mintToken(), ...fast });
  const errors = [];
  c.on("error", (e) => errors.push(e.code));
  await until(() => c.state === "open", "open");
  proxy.down = true;
  proxy.cut();
  await until(() => c.state !== "open", "the drop seen");
  const N = 1000;   // the default queueMax
  const held = Array.from({ length: N }, (_, i) => c.publish(topic, `q${i}`));
  assert.equal(c.queued, N);
  const got = [];
  const watcher = newClient(srv.url, { token: mintToken() });
  await watcher.subscribe(topic, (m) => got.push(m.data)).ready;
  const t0 = Date.now();
  proxy.down = false;
  const seqs = await Promise.all(held);   // a refusal would reject one
  assert.deepEqual(seqs, Array.from({ length: N }, (_, i) => i + 1));
  // the burst of 100, then about 100 a second: not much faster than that
  const took = Date.now() - t0;
  assert.ok(took > 7000, `${took} ms: faster than the server allows`);
  await until(() => got.length === N, "the watcher's 1000");
  assert.deepEqual(got, seqs.map((_, i) => `q${i}`));
  assert.equal(c.queued, 0);
  // the drop, and the attempts refused while the proxy was down: nothing else
  assert.deepEqual(errors.filter((e) => e !== "CONNECT"), ["DISCONNECTED"]);
  await proxy.close();
});

test("a server slower than the default: the client keeps to the rate it says", async () => {
  const slow = await startServer(["--feed", "off", "--pubsub-rate", "20"]);
  const c = newClient(slow.url, { token: mintToken(), ...fast });
  const errors = [];
  c.on("error", (e) => errors.push(e.code));
  // 60 at once: three times the burst of 20, and more refusals than the
  // server takes before it closes (1008) were they sent at our default 100
  const subs = Array.from({ length: 60 }, (_, i) => c.subscribe(`${PREFIX}slow.${i}`, () => {}));
  await Promise.all(subs.map((s) => s.ready));
  assert.deepEqual(errors, []);
  assert.equal(c.state, "open");
  await slow.stop();
});

/** A WebSocket that answers like tern serve but refuses each op once with "rate limit". */
class RefusingOnce {
  static made = [];
  constructor() {
    this.readyState = 0;
    this.sent = [];
    this.seen = new Set();
    this.seq = 0;
    RefusingOnce.made.push(this);
    setTimeout(() => { this.readyState = 1; this.onopen(); });
  }
  send(text) {
    const m = JSON.parse(text);
    this.sent.push({ at: Date.now(), m });
    const id = m.op + " " + (m.topic || "") + " " + (m.data || "");
    let reply;
    if (m.op === "limits") reply = { ok: "limits", rate: 0, max_message: 65536 };
    else if (!this.seen.has(id)) {
      this.seen.add(id);
      reply = { error: "rate limit", op: m.op };
    } else if (m.op === "subscribe") reply = { ok: "subscribe", topic: m.topic, epoch: "0000000000000001", seq: 0 };
    else reply = { ok: "publish", topic: m.topic, seq: ++this.seq };
    setTimeout(() => this.onmessage && this.onmessage({ data: JSON.stringify(reply) }));
  }
  close() {}
}

test("an op refused with \"rate limit\" is sent again after a pause, in order, never dropped", async () => {
  const c = newClient("ws://fake/pubsub", { WebSocket: RefusingOnce });
  const errors = [];
  c.on("error", (e) => errors.push(e.code));
  const s = c.subscribe(PREFIX + "x", () => {});
  const p = [c.publish(PREFIX + "x", "a"), c.publish(PREFIX + "x", "b")];
  await s.ready;
  assert.deepEqual(await Promise.all(p), [1, 2]);
  const ws = RefusingOnce.made[0];
  const ops = ws.sent.map(({ m }) => `${m.op} ${m.data || m.topic || ""}`);
  assert.deepEqual(ops.slice(0, 4), ["limits ", `subscribe ${PREFIX}x`, "publish a", "publish b"]);
  // each refused one again, in the order sent, after the pause
  assert.deepEqual(ops.slice(4), [`subscribe ${PREFIX}x`, "publish a", "publish b"]);
  assert.ok(ws.sent[4].at - ws.sent[3].at >= 150, `${ws.sent[4].at - ws.sent[3].at} ms`);
  assert.deepEqual(errors, []);
});
