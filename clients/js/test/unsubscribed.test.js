// The server ending a subscription (its operator's POST /unsubscribe on
// the admin listener): the client is told with {"event":"unsubscribed"},
// not an ack, ends every subscription of the topic and forgets it.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { PREFIX, SLOW, mintToken, startServer, until, closeAll, newClient, stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer();
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

async function unsubscribeUser(user, topic) {
  const r = await fetch(`${srv.adminUrl}/unsubscribe`, {
    method: "POST",
    headers: { Authorization: `Bearer ${srv.apiKey}` },
    body: JSON.stringify({ user, topic }),
    signal: AbortSignal.timeout(5000 * SLOW),
  });
  assert.equal(r.status, 200);
  return r.json();
}

test("a subscription the server ends is told, gets nothing more, and is not made again", async () => {
  const topic = PREFIX + "ended";
  const ann = newClient(srv.url, { token: mintToken({ sub: "ann" }) });
  const bob = newClient(srv.url, { token: mintToken({ sub: "bob" }) });
  const got = [], ended = [];
  const onUnsubscribed = (s) => ended.push(s);
  const s1 = ann.subscribe(topic, (m) => got.push(m), { onUnsubscribed });
  const s2 = ann.subscribe(topic, (m) => got.push(m), { onUnsubscribed });
  const bobGot = [];
  await Promise.all([s1.ready, s2.ready, bob.subscribe(topic, (m) => bobGot.push(m)).ready]);
  assert.deepEqual(await unsubscribeUser("ann", topic),
    { user: "ann", topic, unsubscribed: 1 });   // one connection, both subscriptions
  await until(() => ended.length === 2, "both of ann's subscriptions to end");
  assert.ok(ended.includes(s1) && ended.includes(s2));
  // the connection goes on, its requests still paired with their answers
  assert.equal(ann.state, "open");
  const seq = await ann.publish(topic, "after");
  await until(() => bobGot.length === 1, "bob's message");
  assert.equal(bobGot[0].seq, seq);
  // subscribing again starts afresh: the client had forgotten the topic
  let info;
  const s3 = ann.subscribe(topic, (m) => got.push(m), { onSubscribed: (i) => { info = i; } });
  await s3.ready;
  assert.equal(info.first, true);
  const next = await bob.publish(topic, "again");
  await until(() => got.length === 1, "ann's new subscription's message");
  assert.equal(got[0].seq, next);
  ann.close();
  bob.close();
});
