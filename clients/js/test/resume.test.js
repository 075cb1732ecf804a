// Reconnects and resumes: a TCP proxy between the clients and tern serve
// cuts and delays their connections at random while a publisher goes on.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { PREFIX, Proxy, mintToken, sleep, startServer, until, closeAll, newClient, stopAll } from "./helpers.js";

afterEach(async () => {
  closeAll();
  await stopAll();
});

const fast = { backoffInitial: 20, backoffMax: 200 };

/** A subscriber through the proxy that records what it is given. */
function subscriber(url, topic) {
  const c = newClient(url, { token: mintToken(), ...fast });
  const rec = { c, got: [], acks: [] };
  rec.sub = c.subscribe(topic, (m) => rec.got.push(m), { onSubscribed: (i) => rec.acks.push(i) });
  return rec;
}

test("cut and delayed at random, every subscriber gets every message once, in order", async () => {
  const srv = await startServer(["--feed", "off", "--pubsub-history", "20000"]);
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "resume";
  const subs = Array.from({ length: 5 }, () => subscriber(proxy.url, topic));
  await Promise.all(subs.map((s) => s.sub.ready));
  proxy.delayMs = () => (Math.random() < 0.3 ? Math.floor(Math.random() * 20) : 0);
  const pub = newClient(srv.url, { token: mintToken() });   // straight to the server
  const N = 3000;
  // Cut at random points of the stream: about every 100 messages, at a
  // random moment of a batch's delivery.
  let cuts = 0;
  const seqs = [];
  for (let i = 0; i < N; i++) {
    seqs.push(pub.publish(topic, `m${i}`, { key: `k${i % 10}` }));
    if (i % 50 === 49) {
      await sleep(5 + Math.random() * 15);
      if (Math.random() < 0.5) {
        proxy.cut();
        cuts++;
      }
    }
  }
  const acked = await Promise.all(seqs);
  proxy.delayMs = () => 0;
  assert.deepEqual(acked, Array.from({ length: N }, (_, i) => i + 1));
  for (const s of subs) await until(() => s.got.length >= N, `a subscriber's ${N} messages`, 20000);
  await sleep(100);   // and nothing more comes
  let totalResumes = 0;
  for (const s of subs) {
    assert.equal(s.got.length, N);
    assert.ok(s.got.every((m, i) => m.seq === i + 1 && m.data === `m${i}` && !m.snapshot),
      "every message once, in order, none marked snapshot");
    const resumes = s.acks.filter((a) => a.resumed === true).length;
    assert.ok(s.acks.every((a) => !a.gap), "no gap while the history reaches");
    assert.ok(resumes >= 1, "resumed at least once");
    totalResumes += resumes;
    assert.equal(s.sub.latest.get("k3").data, `m${N - 7}`);
    s.c.close();
  }
  console.log(`${cuts} cuts, ${totalResumes} resumes over ${subs.length} subscribers`);
  assert.ok(cuts >= 10 && totalResumes >= 10, `${cuts} cuts, ${totalResumes} resumes`);
  pub.close();
  await proxy.close();
  await srv.stop();
});

test("when the history no longer reaches, the handler is told and gets the latest of each key", async () => {
  const srv = await startServer(["--feed", "off", "--pubsub-history", "50"]);
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "gap";
  const s = subscriber(proxy.url, topic);
  await s.sub.ready;
  const pub = newClient(srv.url, { token: mintToken() });
  for (let i = 0; i < 10; i++) await pub.publish(topic, `a${i}`, { key: `k${i % 5}` });
  await until(() => s.got.length === 10, "the first 10");
  proxy.down = true;   // the subscriber cannot come back while 200 more are published
  proxy.cut();
  await until(() => s.c.state === "reconnecting", "the drop seen");
  for (let i = 0; i < 200; i++) await pub.publish(topic, `b${i}`, { key: `k${i % 5}` });
  proxy.down = false;
  await until(() => s.acks.length === 2, "the resubscription");
  const ack = s.acks[1];
  assert.equal(ack.gap, true);
  assert.equal(ack.resumed, false);
  assert.equal(ack.replayed, 5);
  await until(() => s.got.length === 15, "the latest of each key");
  const snap = s.got.slice(10);
  assert.deepEqual(snap.map((m) => [m.key, m.data, m.snapshot]),
    [0, 1, 2, 3, 4].map((k) => [`k${k}`, `b${195 + k}`, true]));
  assert.deepEqual(snap.map((m) => m.seq), [206, 207, 208, 209, 210]);
  // then live again, unmarked, from where the snapshot left
  assert.equal(await pub.publish(topic, "live", { key: "k0" }), 211);
  await until(() => s.got.length === 16, "the live one");
  assert.deepEqual([s.got[15].seq, s.got[15].snapshot], [211, false]);
  assert.equal(s.sub.latest.get("k0").data, "live");
  assert.equal(s.sub.latest.get("k4").data, "b199");
  s.c.close();
  pub.close();
  await proxy.close();
  await srv.stop();
});

test("after a gap, latest is the new server's snapshot: keys it does not have are gone", async () => {
  let srv = await startServer(["--feed", "off", "--pubsub-history", "100"]);
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "regap";
  const c = newClient(proxy.url, { token: mintToken(), ...fast });
  const got = [], acks = [];
  const seen = [];   // the keys latest held at each handler call, and at the gap's onSubscribed
  const keys = (sub) => [...sub.latest.keys()].sort().join(",");
  const sub = c.subscribe(topic, (m, sb) => {
    got.push(m);
    seen.push(keys(sb));
  }, { onSubscribed: (info, sb) => { acks.push(info); seen.push("ack:" + keys(sb)); } });
  const other = c.subscribe(topic, () => {});   // a second one of the topic follows the same rule
  await sub.ready;
  let pub = newClient(srv.url, { token: mintToken() });
  for (const k of ["a", "b", "gone"]) await pub.publish(topic, `old-${k}`, { key: k });
  await until(() => got.length === 3, "the first three");
  assert.equal(keys(sub), "a,b,gone");
  pub.close();
  proxy.down = true;   // the subscriber comes back only once the new server has its keys
  proxy.cut();
  await srv.stop();
  srv = await startServer(["--feed", "off", "--pubsub-history", "100"]);
  proxy.targetPort = srv.port;
  pub = newClient(srv.url, { token: mintToken() });
  for (const k of ["a", "b", "new"]) await pub.publish(topic, `new-${k}`, { key: k });
  seen.length = 0;
  proxy.down = false;
  await until(() => acks.length === 2 && got.length === 6, "the gap and the new snapshot", 10000);
  assert.equal(acks[1].gap, true);
  // replaced before onSubscribed, whole at the first handler call
  assert.deepEqual(seen, ["ack:a,b,new", "a,b,new", "a,b,new", "a,b,new"]);
  for (const x of [sub, other]) {
    assert.deepEqual([...x.latest.entries()].map(([k, m]) => [k, m.data, m.snapshot]).sort(),
      [["a", "new-a", true], ["b", "new-b", true], ["new", "new-new", true]]);
  }
  await proxy.close();
  await srv.stop();
});

test("a server restarted behind the proxy: a new epoch, reported as a gap, then live", async () => {
  let srv = await startServer(["--feed", "off", "--pubsub-history", "100"]);
  const proxy = await new Proxy(srv.port).listen();
  const topic = PREFIX + "restart";
  const s = subscriber(proxy.url, topic);
  await s.sub.ready;
  let pub = newClient(srv.url, { token: mintToken() });
  await pub.publish(topic, "before", { key: "k" });
  await until(() => s.got.length === 1, "the first");
  const states = [];
  s.c.on("state", (st) => states.push(st));
  pub.close();
  await srv.stop();
  srv = await startServer(["--feed", "off", "--pubsub-history", "100"]);
  proxy.targetPort = srv.port;
  await until(() => s.acks.length === 2, "the resubscription to the new server", 10000);
  assert.equal(s.acks[1].gap, true);
  assert.notEqual(s.acks[1].epoch, s.acks[0].epoch);
  assert.ok(states.includes("reconnecting") && states.at(-1) === "open", states.join(","));
  pub = newClient(srv.url, { token: mintToken() });
  assert.equal(await pub.publish(topic, "after", { key: "k" }), 1);
  await until(() => s.got.length === 2, "the new server's first");
  assert.deepEqual([s.got[1].data, s.got[1].seq, s.got[1].snapshot], ["after", 1, false]);
  s.c.close();
  pub.close();
  await proxy.close();
  await srv.stop();
});
