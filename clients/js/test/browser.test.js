// The browser's signals, with window, document and navigator stood in for
// (this file runs in a process of its own): offline, no attempt is made;
// back online, or the page shown again, the client tries at once instead
// of waiting out its backoff.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { Proxy, closeAll, mintToken, newClient, sleep, startServer, stopAll, until } from "./helpers.js";

let srv;
before(async () => {
  srv = await startServer(["--feed", "off"]);
  globalThis.window = new EventTarget();
  globalThis.document = Object.assign(new EventTarget(), { visibilityState: "hidden" });
  Object.defineProperty(globalThis, "navigator", { value: { onLine: true }, configurable: true,
                                                   writable: true });
});
afterEach(closeAll);
after(async () => {
  closeAll();
  await stopAll();
});

test("offline: no attempt until the network is back, then one at once", async () => {
  const proxy = await new Proxy(srv.port).listen();
  proxy.down = true;
  navigator.onLine = false;
  const c = newClient(proxy.url, { token: mintToken(), backoffInitial: 10, backoffMax: 20 });
  await until(() => c.state === "reconnecting", "the first attempt refused");
  await sleep(300);
  assert.equal(proxy.accepted, 1, "no retry while offline");
  proxy.down = false;
  navigator.onLine = true;
  const t0 = Date.now();
  window.dispatchEvent(new Event("online"));
  await until(() => c.state === "open", "open once online");
  assert.ok(Date.now() - t0 < 500);
  assert.equal(proxy.accepted, 2);
});

test("the page shown again: the retry waiting out its backoff is made now", async () => {
  const proxy = await new Proxy(srv.port).listen();
  proxy.down = true;
  const c = newClient(proxy.url, { token: mintToken(), backoffInitial: 60000,
                                   random: () => 0.99 });   // the first retry in about a minute
  await until(() => c.state === "reconnecting", "the first attempt refused");
  proxy.down = false;
  await sleep(200);
  assert.equal(c.state, "reconnecting");
  document.visibilityState = "visible";
  document.dispatchEvent(new Event("visibilitychange"));
  await until(() => c.state === "open", "open once visible", 1000);
  c.close();
  // and a closed client no longer listens
  document.dispatchEvent(new Event("visibilitychange"));
  window.dispatchEvent(new Event("online"));
  await sleep(100);
  assert.equal(proxy.accepted, 2);
});
