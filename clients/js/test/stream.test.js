// The fallback to HTTP streaming (tern serve's /http-stream): behind a
// proxy that refuses WebSocket upgrades the client moves to it by itself,
// says so, and keeps its whole API: subscribe with resume, publish,
// presence, token refresh.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { NoUpgradeProxy, PREFIX, mintToken, sleep, startServer, until, closeAll, newClient,
         stopAll } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--feed", "off", "--pubsub-history", "1000",
                           "--topic", `${PREFIX}pr.* presence=on`]);
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

test("behind a proxy that refuses WebSockets: http-stream after two attempts, the same API", async () => {
  const proxy = await new NoUpgradeProxy(srv.port).listen();
  const c = newClient(proxy.url, { token: mintToken(), backoffInitial: 10 });
  const transports = [];
  c.on("transport", (t) => transports.push(t));
  const got = [];
  const s = c.subscribe(PREFIX + "fb", (m) => got.push(m.data));
  await s.ready;
  assert.equal(c.transport, "http-stream");
  assert.deepEqual(transports, ["http-stream"]);
  assert.equal(proxy.refused, 2);   // fallbackAfter's default
  assert.equal(await c.publish(PREFIX + "fb", "over http"), 1);
  await until(() => got.includes("over http"), "its own message");
  // presence, where the rule allows it
  await c.subscribe(PREFIX + "pr.room", () => {}).ready;
  const p = await c.presence(PREFIX + "pr.room");
  assert.equal(p.clients, 1);
  assert.equal(p.presence[0].user, "client-test");
  // a cut: the client comes back on the stream and resumes with no gap
  const pub = newClient(srv.url, { token: mintToken() });
  proxy.cut();
  for (let i = 0; i < 20; i++) await pub.publish(PREFIX + "fb", `m${i}`);
  await until(() => got.length === 21, "every message after the cut");
  assert.deepEqual(got.slice(1), Array.from({ length: 20 }, (_, i) => `m${i}`));
  assert.equal(c.transport, "http-stream");
  assert.equal(proxy.refused, 2);   // it stays on the transport that worked
});

test("transports: ['http-stream'] uses it from the first attempt; unsubscribe and refresh work", async () => {
  const asked = [];
  const c = newClient(srv.url, {
    transports: ["http-stream"],
    getToken: async () => {
      asked.push(Date.now());
      return mintToken({ ttl: 3 });   // the server closes at exp (4001) without a refresh
    },
  });
  const errors = [];
  c.on("error", (e) => errors.push(e.code));
  const got = [];
  const s = c.subscribe(PREFIX + "only", (m) => got.push(m.data));
  await s.ready;
  assert.equal(c.transport, "http-stream");
  await sleep(4000);   // past the first token's exp: refreshed over the stream
  assert.ok(asked.length >= 2, `getToken asked ${asked.length} times`);
  assert.deepEqual(errors, []);
  await c.publish(PREFIX + "only", "after the refresh");
  await until(() => got.length === 1, "a message on the same stream");
  s.unsubscribe();
  await c.publish(PREFIX + "only", "not for us");
  await sleep(200);
  assert.equal(got.length, 1);
});

test("where WebSockets open, the transport is websocket", async () => {
  const c = newClient(srv.url, { token: mintToken() });
  const transports = [];
  c.on("transport", (t) => transports.push(t));
  await c.subscribe(PREFIX + "ws", () => {}).ready;
  assert.equal(c.transport, "websocket");
  assert.deepEqual(transports, ["websocket"]);
});
