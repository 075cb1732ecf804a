// tern-client: the client of tern serve's /pubsub (src/app/serve_pubsub.c
// says the protocol), for browsers and Node. One ES module, no runtime
// dependency in a browser (its WebSocket); in Node the global WebSocket
// where there is one (Node 22 and later), else the `ws` package.
//
// What it does for the application: reconnects with exponential backoff
// and full jitter; resumes every subscription from its last (epoch, seq)
// so nothing is missed while the server's history reaches back, and says
// so when it does not (the messages then are the latest of each key,
// marked `snapshot`); keeps the latest message of each key per
// subscription; numbers publishes by the server's acks; keeps a bounded
// queue of publishes while disconnected; keeps to the server's rate limit
// (asked with {"op":"limits"}), so that a reconnect's burst of
// resubscriptions and queued publishes is paced, never refused; gets
// tokens again before they expire; asks who is in a topic (presence) and
// hands on the joins and leaves the server pushes (src/app/serve_presence.h
// says that protocol); falls back to HTTP streaming (tern serve's
// /http-stream, src/app/serve_stream.c) where WebSockets cannot open, and
// says which transport it uses.

const DEFAULTS = {
  backoffInitial: 250,     // ms: the first retry waits up to this
  backoffMax: 10000,       // ms: no retry waits longer
  refreshMargin: 30000,    // ms before a token's exp to get a new one (at most half its life)
  queueMax: 1000,          // publishes held while disconnected
  queuePolicy: "reject-new",
  rate: 100,               // messages a second when the server does not say (tern serve's default)
  transports: ["websocket", "http-stream"],   // tried in this order
  fallbackAfter: 2,        // WebSocket attempts that never opened before trying the next transport
};

const OPEN = 1;   // WebSocket.OPEN, the same in every implementation
// The client refills its allowance a little slower than the server's rate:
// the server's clock and ours differ by a few milliseconds, and a refusal
// costs more (a retry, and the server closes a client refused too often).
const PACE = 0.9;
// After a "rate limit" refusal (a server whose rate fell, or that did not
// say it), nothing more is sent for this long: the server's allowance
// fills up again, and the refused request is sent again first.
const RETRY_MS = 200;

/** An error of the client or the server; `code` says which (README). */
export class TernError extends Error {
  constructor(code, message, detail) {
    super(message);
    this.name = "TernError";
    this.code = code;
    if (detail !== undefined) this.detail = detail;
  }
}

/**
 * The delay before reconnect attempt `attempt` (0 for the first): full
 * jitter, uniform in [0, min(max, initial * 2^attempt)), so that clients
 * cut at once do not all come back at once.
 */
export function backoffDelay(attempt, initial, max, random = Math.random) {
  const ceiling = Math.min(max, initial * Math.pow(2, Math.min(attempt, 30)));
  return Math.floor(random() * ceiling);
}

/** The exp claim (seconds) of a JWT, or undefined when it has none. */
export function tokenExp(token) {
  try {
    const part = token.split(".")[1];
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4)));
    return typeof claims.exp === "number" ? claims.exp : undefined;
  } catch {
    return undefined;
  }
}

let wsModule = null;   // the `ws` package, loaded once when Node needs it

async function webSocketClass(given) {
  if (given) return given;
  if (typeof globalThis.WebSocket === "function") return globalThis.WebSocket;
  if (!wsModule) {
    try {
      wsModule = await import("ws");
    } catch (e) {
      throw new TernError("NO_WEBSOCKET",
        "no WebSocket here: install the `ws` package or pass options.WebSocket", e);
    }
  }
  return wsModule.WebSocket || wsModule.default;
}

// The HTTP-streaming URL of a /pubsub URL: ws(s)://host/path/pubsub?q
// -> http(s)://host/path/http-stream?q.
function httpStreamUrl(url) {
  const u = new URL(url);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.pathname = u.pathname.replace(/\/pubsub$/, "") + "/http-stream";
  return u.toString();
}

/**
 * tern serve's HTTP-streaming transport behind a WebSocket's interface
 * (readyState, send, close, onopen, onmessage, onerror, onclose), so that
 * the client above does not know which it has: GET /http-stream is one
 * long response of JSON lines (its session first, then every /pubsub
 * message, last {"close":code,"reason":...}); what send() is given goes
 * in POSTs to /http-stream/ops?session=ID, one at a time, so in order
 * (what waits meanwhile goes together in the next one, a line each).
 * Needs a fetch whose response body streams (Node 18+, browsers).
 */
class HttpStreamSocket {
  constructor(url, fetchFn) {
    this.readyState = 0;   // CONNECTING
    this.onopen = this.onmessage = this.onerror = this.onclose = null;
    this._fetch = fetchFn || globalThis.fetch.bind(globalThis);
    this._abort = new AbortController();
    this._url = url;
    this._waiting = [];      // sent, not POSTed yet
    this._posting = false;   // a POST is under way
    this._session = null;
    this._run();
  }

  async _run() {
    let code = 1006, reason = "";
    try {
      const res = await this._fetch(this._url, { signal: this._abort.signal, cache: "no-store" });
      if (!res.ok) {
        // the same words as the ws package's, which the client reads
        this._fire("onerror", { message: `Unexpected server response: ${res.status}` });
      } else {
        const reader = res.body.getReader();
        const text = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += text.decode(value, { stream: true });
          let nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            if (line === "") continue;   // the keep-alive
            if (this._session === null) {
              this._session = JSON.parse(line).session;
              this.readyState = 1;   // OPEN
              this._fire("onopen", {});
            } else if (line.startsWith('{"close":')) {
              ({ close: code, reason } = JSON.parse(line));
            } else {
              this._fire("onmessage", { data: line });
            }
          }
        }
      }
    } catch (e) {
      if (this.readyState !== 3) this._fire("onerror", { message: e.message });
    }
    this._closed(code, reason);
  }

  _fire(name, ev) {
    if (this[name]) this[name](ev);
  }

  _closed(code, reason) {
    if (this.readyState === 3) return;
    this.readyState = 3;   // CLOSED
    this._abort.abort();
    this._fire("onclose", { code, reason });
  }

  send(data) {
    if (this.readyState !== 1) throw new Error("not open");
    this._waiting.push(data);
    if (!this._posting) this._post();
  }

  async _post() {
    this._posting = true;
    const url = this._url.replace(/\?.*$/, "") + "/ops?session=" + this._session;
    while (this._waiting.length > 0 && this.readyState === 1) {
      const body = this._waiting.splice(0).join("\n");
      try {
        const res = await this._fetch(url, { method: "POST", body, signal: this._abort.signal });
        if (!res.ok) throw new Error(`ops: ${res.status}`);
      } catch (e) {
        // the stream is gone, or going: its end says how
        this._closed(1006, e.message);
      }
    }
    this._posting = false;
  }

  close() {
    this._closed(1000, "");
  }
}

/**
 * One subscription as the application holds it. `latest` maps each key to
 * its latest message (messages without a key are not in it).
 */
class Subscription {
  constructor(client, topic, handler, options) {
    this.topic = topic;
    this.latest = new Map();
    this._client = client;
    this._handler = handler;
    this._onSubscribed = options.onSubscribed;
    this._onJoin = options.onJoin;
    this._onLeave = options.onLeave;
    this._onUnsubscribed = options.onUnsubscribed;
    this._snapshot = options.snapshot !== false;
    this._closed = false;
    this.ready = new Promise((resolve, reject) => {
      this._ready = { resolve, reject };
    });
    // Nobody has to wait on ready: an unhandled refusal is also an error event.
    this.ready.catch(() => {});
  }

  /** Stops the handler; the server is told when no other subscription of the topic is left. */
  unsubscribe() {
    if (this._closed) return;
    this._closed = true;
    this._client._unsubscribe(this);
  }
}

/**
 * What the client knows of one topic it is subscribed to, for every
 * Subscription of it. Invariants: epoch/seq are where the stream stands
 * (the last ack's, then the last message's); pending is set from a
 * subscribe sent until its ack, and buffer holds the topic's messages
 * received meanwhile (the replay or snapshot, which only the ack says).
 */
class TopicState {
  constructor(topic, snapshot) {
    this.topic = topic;
    this.subs = new Set();
    this.snapshot = snapshot;
    this.epoch = null;
    this.seq = 0;
    this.pending = false;
    this.buffer = [];
    this.acked = false;   // subscribed at least once (a later ack is a resume)
  }
}

export class TernClient {
  /**
   * @param {string} url  ws:// or wss:// URL of /pubsub
   * @param {object} options  see tern-client.d.ts
   */
  constructor(url, options = {}) {
    this.url = url;
    this.options = { ...DEFAULTS, ...options };
    if (!["reject-new", "drop-oldest"].includes(this.options.queuePolicy))
      throw new TypeError("queuePolicy: reject-new or drop-oldest");
    this.state = "idle";
    this._token = options.token || null;
    this._tokenStale = false;
    this._listeners = new Map();
    this._topics = new Map();       // topic -> TopicState
    // Every request goes through the outbox: sent in order as the rate
    // allows, then in _requests until its answer. Invariants: _requests
    // holds what was sent on this connection, oldest first (the server
    // answers in order); _retry holds what the server refused for its rate,
    // sent again before anything of _outbox; while disconnected both
    // _outbox and _retry hold publishes only (the queue, at most queueMax
    // of them unless the connection dropped with more waiting).
    this._requests = [];
    this._retry = [];
    this._outbox = [];
    this._rate = null;              // the server's rate (its limits answer), null until it says
    this._tokens = 0;               // messages that may be sent now (fractions refill)
    this._stamp = 0;                // when _tokens was last refilled (ms)
    this._holdUntil = 0;            // nothing sent before this (ms): after a refusal
    this._limitsPending = false;    // the limits question is unanswered: nothing else is sent
    this._pumpTimer = null;
    this._socket = null;
    this._attempt = 0;
    // The transport in use (null until a connection opens), and the one
    // the next attempt takes: options.transports[_transportAt], moved on
    // (_failures: attempts on it that never opened) while none has opened.
    this.transport = null;
    this._transportAt = 0;
    this._failures = 0;
    this._retryTimer = null;
    this._refreshTimer = null;
    this._random = options.random || Math.random;
    this._browser = typeof window !== "undefined" && typeof document !== "undefined";
    if (this._browser) {
      // Back online, or the page shown again while a retry waits: try now.
      this._onOnline = () => this._retryNow();
      this._onVisible = () => { if (document.visibilityState === "visible") this._retryNow(); };
      window.addEventListener("online", this._onOnline);
      document.addEventListener("visibilitychange", this._onVisible);
    }
    if (options.connect !== false) this.connect();
  }

  /**
   * Listens to "state" (state, previous), "error" (TernError), "join" and
   * "leave" ({topic, client, user, info}); returns a function that stops it.
   */
  on(event, fn) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(fn);
    return () => this._listeners.get(event).delete(fn);
  }

  _emit(event, ...args) {
    for (const fn of this._listeners.get(event) || []) {
      try {
        fn(...args);
      } catch (e) {
        // a listener's bug must not stop the client; it still shows
        setTimeout(() => { throw e; });
      }
    }
  }

  _error(code, message, detail) {
    const e = new TernError(code, message, detail);
    this._emit("error", e);
    return e;
  }

  _setState(s) {
    if (s === this.state) return;
    const prev = this.state;
    this.state = s;
    this._emit("state", s, prev);
  }

  /** Opens the connection (the constructor does unless options.connect is false). */
  connect() {
    if (this.state === "closed") throw new TernError("CLOSED", "the client is closed");
    if (this._socket || this._retryTimer) return;
    this._open();
  }

  /** Drops the connection and opens a new one at once; every subscription resumes. */
  reconnect() {
    if (this.state === "closed") return;
    this._attempt = 0;
    this._closeSocket(1000, "reconnect");
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._open();
  }

  async _open() {
    this._setState("connecting");
    const socketMarker = {};
    this._socket = socketMarker;   // taken: no second _open meanwhile
    let ws;
    try {
      const kind = this.options.transports[this._transportAt];
      const WS = kind === "http-stream" ? null : await webSocketClass(this.options.WebSocket);
      if (this.options.getToken && (!this._token || this._tokenStale || this._expiresSoon())) {
        this._token = await this.options.getToken();
        this._tokenStale = false;
      }
      if (this._socket !== socketMarker) return;   // closed or reconnected meanwhile
      let url = this.url;
      if (this._token)
        url += (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(this._token);
      ws = WS ? new WS(url) : new HttpStreamSocket(httpStreamUrl(url), this.options.fetch);
      ws.transport = kind;
    } catch (e) {
      if (this._socket !== socketMarker) return;
      this._socket = null;
      this._error(e.code || "CONNECT", "could not connect: " + e.message, e);
      this._scheduleRetry();
      return;
    }
    this._socket = ws;
    let opened = false;
    let failure = null;   // what the WebSocket said went wrong before it opened
    ws.onopen = () => {
      if (this._socket !== ws) return;
      opened = true;
      this._attempt = 0;
      if (this.transport !== ws.transport) {
        this.transport = ws.transport;
        this._emit("transport", ws.transport);
      }
      this._setState("open");
      this._askLimits();
      this._resubscribe();
      this._pump();
      this._scheduleRefresh();
    };
    ws.onmessage = (ev) => {
      if (this._socket === ws) this._onMessage(ev.data);
    };
    ws.onerror = (ev) => {
      // onclose follows and says what to do; ws (Node) says why here
      failure = (ev && (ev.message || (ev.error && ev.error.message))) || null;
    };
    ws.onclose = (ev) => {
      if (this._socket !== ws) return;
      this._drop(ws);
      if (ev.code === 4001) {
        // the server's "token expired": a new one, and back at once
        this._tokenStale = true;
        this._error("TOKEN_EXPIRED", "the token expired");
      } else if (!opened && this.options.getToken) {
        // Refused before it opened: a browser cannot tell a 401 from a
        // server that is down, so the next attempt gets a new token.
        this._tokenStale = true;
      }
      if (opened) {
        this._error("DISCONNECTED", `connection closed (${ev.code})`, { code: ev.code, reason: ev.reason });
      } else {
        // Never opened: refused, unreachable, or an HTTP answer instead of
        // 101 (a 401 for a bad token). A browser says nothing more; the
        // ws package names the cause and the status.
        const detail = { code: ev.code, reason: ev.reason };
        const status = failure && /server response: (\d{3})/.exec(failure);
        if (status) detail.status = Number(status[1]);
        this._error("CONNECT", "could not connect" + (failure ? ": " + failure : ""), detail);
        // Until a connection has opened, a WebSocket that never opens, again
        // and again, may be a network that refuses them (a proxy), or a
        // server that is down: after fallbackAfter of them the next
        // transport gets one attempt, then WebSockets again, and so on,
        // with the same backoff. The first transport that opens is the
        // network's answer, and stays.
        const kind = ws.transport;
        if (this.transport === null &&
            ++this._failures >= (kind === "websocket" ? this.options.fallbackAfter : 1)) {
          this._transportAt = (this._transportAt + 1) % this.options.transports.length;
          this._failures = 0;
        }
      }
      this._scheduleRetry();
    };
  }

  _expiresSoon() {
    const exp = tokenExp(this._token);
    return exp !== undefined && exp * 1000 - Date.now() < 1000;
  }

  // What ends with a connection: its requests fail (a publish sent may or
  // may not have been published), its subscriptions wait for the next one.
  //
  // Publishes not sent yet (waiting for the rate, or refused for it: the
  // server did not do them) stay, in order, for the next connection, within
  // queueMax as a publish made while disconnected is; the other requests
  // not sent are made again by the next connection (subscribes) or fail.
  _drop(ws) {
    if (this._socket === ws) this._socket = null;
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    clearTimeout(this._pumpTimer);
    this._pumpTimer = null;
    this._limitsPending = false;
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => {};
    const gone = new TernError("DISCONNECTED", "the connection closed before the answer");
    const reqs = this._requests;
    this._requests = [];
    for (const item of reqs) item.r.reject(gone);
    const unsent = this._retry.concat(this._outbox);
    this._retry = [];
    this._outbox = [];
    for (const item of unsent) {
      if (item.msg.op === "publish") this._outbox.push(item);
      else item.r.reject(gone);
    }
    // Over the bound: the queue's policy decides, as for a new publish.
    while (this._outbox.length > this.options.queueMax) {
      const item = this.options.queuePolicy === "drop-oldest" ? this._outbox.shift() : this._outbox.pop();
      item.r.reject(this.options.queuePolicy === "drop-oldest"
        ? new TernError("DROPPED", "dropped from the full queue (drop-oldest)")
        : new TernError("QUEUE_FULL", "disconnected and the queue is full"));
    }
    for (const t of this._topics.values()) {
      t.pending = false;
      t.buffer = [];
    }
  }

  // Ends the connection (or the attempt being made) on our side.
  _closeSocket(code, reason) {
    const ws = this._socket;
    if (!ws) return;
    if (typeof ws.close !== "function") {
      this._socket = null;   // an attempt still getting its token: it sees it is not wanted
      return;
    }
    this._drop(ws);
    try {
      ws.close(code, reason);
    } catch {
      // closing a socket that is still connecting throws in some implementations; it is dropped anyway
    }
  }

  _scheduleRetry() {
    if (this.state === "closed") return;
    this._setState("reconnecting");
    if (this._browser && navigator.onLine === false) return;   // "online" will call _retryNow
    const delay = backoffDelay(this._attempt++, this.options.backoffInitial,
                               this.options.backoffMax, this._random);
    this._retryTimer = setTimeout(() => {
      this._retryTimer = null;
      this._open();
    }, delay);
  }

  _retryNow() {
    if (this.state !== "reconnecting" || this._socket) return;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._open();
  }

  // Before the token's exp, a new one over the same connection.
  _scheduleRefresh(expSeconds) {
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    if (!this.options.getToken || !this._token) return;
    const exp = expSeconds ?? tokenExp(this._token);
    if (exp === undefined) return;
    const left = exp * 1000 - Date.now();
    const wait = Math.max(0, Math.max(left / 2, left - this.options.refreshMargin));
    const ws = this._socket;
    this._refreshTimer = setTimeout(async () => {
      this._refreshTimer = null;
      let token;
      try {
        token = await this.options.getToken();
      } catch (e) {
        this._error("TOKEN", "getToken failed: " + e.message, e);
        return;   // the server closes at exp (4001); the reconnect asks again
      }
      if (this._socket !== ws || ws.readyState !== OPEN) return;
      this._token = token;
      this._request({ op: "refresh", token }, {
        resolve: (m) => this._scheduleRefresh(m.exp),
        reject: (e) => this._error("TOKEN", "the server refused the new token: " + e.message, e),
      });
    }, wait);
  }

  _send(msg) {
    this._socket.send(JSON.stringify(msg));
  }

  // A message the server answers (once, in order): r gets the answer. It
  // waits in the outbox until the rate allows it; at `at` in the outbox
  // (the resubscriptions go before the queued publishes), else last.
  _request(msg, r, at) {
    const item = { msg, r };
    if (at === undefined) this._outbox.push(item);
    else this._outbox.splice(at, 0, item);
    if (at === undefined) this._pump();
  }

  // Asked first on every connection: the rate the server holds this
  // connection to. Until the answer nothing else is sent, so that even
  // the first burst keeps to a rate lower than our default. A server that
  // does not know the op ("unknown op") leaves options.rate.
  _askLimits() {
    this._rate = null;
    this._tokens = 0;
    this._holdUntil = 0;
    this._limitsPending = true;
    this._send({ op: "limits" });
    const done = (rate) => {
      this._limitsPending = false;
      this._rate = rate;
      // A new connection starts with its whole burst, as the server's
      // does, less the limits question it has already paid for.
      this._tokens = Math.max(0, (this._effectiveRate() || 0) - 1);
      this._stamp = Date.now();
      this._pump();
    };
    this._requests.push({ msg: { op: "limits" }, r: {
      resolve: (m) => done(typeof m.rate === "number" ? m.rate : null),
      reject: (e) => {
        if (e.code === "DISCONNECTED") return;
        done(null);
      },
    } });
  }

  // Messages a second this client keeps to: the server's, when it said;
  // 0 is no limit.
  _effectiveRate() {
    return this._rate !== null ? this._rate : this.options.rate;
  }

  // Sends what the outbox holds, as far as the rate allows now; a timer
  // comes back for the rest. What the server refused for its rate goes
  // first, so the order of requests is kept.
  _pump() {
    clearTimeout(this._pumpTimer);
    this._pumpTimer = null;
    const ws = this._socket;
    if (!ws || ws.readyState !== OPEN || this._limitsPending) return;
    const rate = this._effectiveRate();
    const now = Date.now();
    if (now < this._holdUntil) {
      this._pumpTimer = setTimeout(() => this._pump(), this._holdUntil - now);
      return;
    }
    if (rate > 0) {
      this._tokens = Math.min(rate, this._tokens + ((now - this._stamp) / 1000) * rate * PACE);
      this._stamp = now;
    }
    while (this._retry.length || this._outbox.length) {
      if (rate > 0) {
        if (this._tokens < 1) {
          const wait = Math.ceil(((1 - this._tokens) * 1000) / (rate * PACE));
          this._pumpTimer = setTimeout(() => this._pump(), wait);
          return;
        }
        this._tokens -= 1;
      }
      const item = this._retry.length ? this._retry.shift() : this._outbox.shift();
      this._send(item.msg);
      this._requests.push(item);
    }
  }

  // The server refused item for its rate, and did not do it: it is sent
  // again, before anything not sent yet and after any refused before it.
  _refused(item) {
    this._retry.push(item);
    this._holdUntil = Date.now() + RETRY_MS;
    this._tokens = 0;
    this._pump();
  }

  _onMessage(text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      this._error("PROTOCOL", "not JSON from the server", text);
      return;
    }
    // An event the server sends of itself, which no request waits for.
    if (m.event === "unsubscribed" && typeof m.topic === "string") {
      this._unsubscribedByServer(m.topic);
      return;
    }
    if (m.ok !== undefined || m.error !== undefined) {
      const item = this._requests.shift();
      if (!item) return;
      if (m.error === "rate limit" && item.msg.op !== "limits") this._refused(item);
      else if (m.error !== undefined) item.r.reject(new TernError("SERVER", m.error, m));
      else item.r.resolve(m);
      return;
    }
    if (typeof m.topic === "string" && (m.join !== undefined || m.leave !== undefined)) {
      this._presenceEvent(m);
      return;
    }
    if (typeof m.topic !== "string" || typeof m.seq !== "number") return;
    const t = this._topics.get(m.topic);
    if (!t || t.unsubscribing) return;   // its subscription ended
    if (t.pending) {
      t.buffer.push(m);   // a replay or a snapshot: the ack says which
      return;
    }
    this._deliver(t, TernClient._message(m, false));
  }

  // A join or leave the server pushed (a topic whose rule says
  // join-leave=on): to the topic's subscriptions' onJoin/onLeave, then the
  // client's "join"/"leave" listeners. Not part of the topic's numbered
  // stream: seq, latest and resume do not see it.
  _presenceEvent(m) {
    const t = this._topics.get(m.topic);
    if (!t || t.unsubscribing) return;   // its subscription ended
    const kind = m.join !== undefined ? "join" : "leave";
    const who = m[kind] || {};
    const ev = { topic: m.topic, client: who.client, user: who.user };
    if (who.info !== undefined) ev.info = who.info;
    for (const s of t.subs) {
      const fn = kind === "join" ? s._onJoin : s._onLeave;
      if (s._closed || !fn) continue;
      try {
        fn(ev, s);
      } catch (e) {
        setTimeout(() => { throw e; });
      }
    }
    this._emit(kind, ev);
  }

  // The application's form of a server message m.
  static _message(m, snapshot) {
    const msg = { topic: m.topic, seq: m.seq, data: m.data, snapshot };
    if (m.key !== undefined) msg.key = m.key;
    return msg;
  }

  // Calls every handler of t with msg; latest takes it first unless it
  // already holds it (a snapshot is put in whole before its first call).
  _deliver(t, msg, stored = false) {
    t.seq = msg.seq;
    for (const s of t.subs) {
      if (s._closed) continue;
      if (msg.key !== undefined && !stored) s.latest.set(msg.key, msg);
      try {
        s._handler(msg, s);
      } catch (e) {
        setTimeout(() => { throw e; });
      }
    }
  }

  // Every subscription again, ahead of the publishes queued meanwhile (a
  // publisher subscribed to its own topic gets them).
  _resubscribe() {
    let at = 0;
    for (const t of this._topics.values()) this._sendSubscribe(t, at++);
  }

  _sendSubscribe(t, at) {
    const msg = { op: "subscribe", topic: t.topic };
    if (t.epoch) {
      msg.epoch = t.epoch;
      msg.after = String(t.seq);
    } else if (t.snapshot) {
      msg.snapshot = true;
    }
    t.pending = true;
    t.buffer = [];
    this._request(msg, {
      resolve: (ack) => this._subscribed(t, ack),
      reject: (e) => {
        t.pending = false;
        t.buffer = [];
        if (e.code === "DISCONNECTED") return;   // the next connection asks again
        this._topics.delete(t.topic);
        const err = new TernError("SUBSCRIBE", `subscribe ${t.topic}: ${e.message}`, e.detail);
        this._emit("error", err);
        for (const s of t.subs) {
          s._closed = true;
          s._ready.reject(err);
        }
      },
    }, at);
  }

  _subscribed(t, ack) {
    const buffered = t.buffer;
    t.pending = false;
    t.buffer = [];
    if (ack.epoch === undefined) return;   // "already subscribed": nothing changes
    // A resume that could not be one (resumed:false: another epoch, or the
    // history no longer reaches back) and a snapshot both send the latest
    // message of each key: the application is told, and they are marked.
    const resumed = ack.resumed;
    const gap = resumed === false;
    const snapshot = gap || ack.snapshot !== undefined;
    const info = { topic: t.topic, epoch: ack.epoch, seq: ack.seq, resumed, gap,
                   replayed: ack.replayed ?? ack.snapshot ?? 0, first: !t.acked };
    t.acked = true;
    const msgs = buffered.map((m) => TernClient._message(m, snapshot));
    if (snapshot) {
      // A snapshot is the topic's state as this server has it: it replaces
      // latest whole (after a gap, keys the server no longer has are gone)
      // before onSubscribed and the first handler call, so that both see
      // every key at once rather than one more per message.
      for (const s of t.subs) {
        if (s._closed) continue;
        s.latest.clear();
        for (const msg of msgs) if (msg.key !== undefined) s.latest.set(msg.key, msg);
      }
    }
    for (const s of t.subs) {
      s._ready.resolve(info);
      if (s._onSubscribed && !s._closed) {
        try {
          s._onSubscribed(info, s);
        } catch (e) {
          setTimeout(() => { throw e; });
        }
      }
    }
    // a replay (resumed: true) is the stream's next messages: latest
    // follows it one message at a time, as it does live
    for (const msg of msgs) this._deliver(t, msg, snapshot);
    t.epoch = ack.epoch;
    t.seq = ack.seq;
  }

  /**
   * Calls handler(message, subscription) for every message of topic.
   * options.snapshot (default true): start with the latest message of each
   * key; options.onSubscribed(info): at every (re)subscription;
   * options.onUnsubscribed(sub): when the server ended it.
   */
  subscribe(topic, handler, options = {}) {
    if (this.state === "closed") throw new TernError("CLOSED", "the client is closed");
    if (typeof topic !== "string" || topic === "") throw new TypeError("topic: a non-empty string");
    if (typeof handler !== "function") throw new TypeError("handler: a function");
    const s = new Subscription(this, topic, handler, options);
    let t = this._topics.get(topic);
    if (t && t.unsubscribing) {
      // subscribed again once the server has answered the unsubscribe
      if (!t.next) t.next = new TopicState(topic, s._snapshot);
      t.next.subs.add(s);
      return s;
    }
    if (t) {
      t.subs.add(s);
      // the topic's stream is already there: this one starts where it stands
      if (t.acked && !t.pending) {
        for (const m of t.subs.values().next().value.latest.values()) s.latest.set(m.key, m);
        s._ready.resolve({ topic, epoch: t.epoch, seq: t.seq, resumed: undefined, gap: false,
                           replayed: 0, first: true });
      }
      return s;
    }
    t = new TopicState(topic, s._snapshot);
    t.subs.add(s);
    this._topics.set(topic, t);
    if (this._socket && this._socket.readyState === OPEN) this._sendSubscribe(t);
    return s;
  }

  // The server ended the topic's subscription (its operator's server API):
  // every subscription of it ends, and none is made again on a reconnect.
  // One the client is itself ending (unsubscribing) ends as it would.
  _unsubscribedByServer(topic) {
    const t = this._topics.get(topic);
    if (!t || t.unsubscribing) return;
    this._topics.delete(topic);
    for (const s of t.subs) {
      if (s._closed) continue;
      s._closed = true;
      if (!s._onUnsubscribed) continue;
      try {
        s._onUnsubscribed(s);
      } catch (e) {
        setTimeout(() => { throw e; });
      }
    }
  }

  _unsubscribe(s) {
    const t = this._topics.get(s.topic);
    if (!t) return;
    if (t.unsubscribing) {
      // one waiting for the unsubscribe's answer
      if (t.next) t.next.subs.delete(s);
      if (t.next && t.next.subs.size === 0) t.next = null;
      return;
    }
    t.subs.delete(s);
    if (t.subs.size > 0) return;
    this._topics.delete(s.topic);
    if (!this._socket || this._socket.readyState !== OPEN || !t.acked && !t.pending) return;
    // Until the server's answer, messages of the topic belong to the old
    // subscription: a subscribe made meanwhile must not get them.
    const marker = new TopicState(s.topic, false);
    marker.unsubscribing = true;
    this._topics.set(s.topic, marker);
    const done = () => {
      if (this._topics.get(s.topic) !== marker) return;
      const next = marker.next;
      if (next) {
        this._topics.set(s.topic, next);
        if (this._socket && this._socket.readyState === OPEN) this._sendSubscribe(next);
      } else {
        this._topics.delete(s.topic);
      }
    };
    this._request({ op: "unsubscribe", topic: s.topic }, { resolve: done, reject: done });
  }

  /**
   * Publishes data (a string) to topic, with options.key for conflation.
   * Resolves with the message's seq (the server's ack); rejects with a
   * TernError (README: codes).
   */
  publish(topic, data, options = {}) {
    if (typeof data !== "string") return Promise.reject(new TypeError("data: a string"));
    if (this.state === "closed") return Promise.reject(new TernError("CLOSED", "the client is closed"));
    const msg = { op: "publish", topic, data };
    if (options.key !== undefined) msg.key = options.key;
    return new Promise((resolve, reject) => {
      const r = { resolve: (ack) => resolve(ack.seq), reject };
      if (this._socket && this._socket.readyState === OPEN) {
        this._request(msg, r);   // sent now, or as soon as the rate allows
        return;
      }
      // Disconnected: held for the next connection, within the bound
      // (while disconnected the outbox holds publishes only).
      if (this._outbox.length >= this.options.queueMax) {
        if (this.options.queuePolicy === "drop-oldest" && this._outbox.length > 0) {
          this._outbox.shift().r.reject(new TernError("DROPPED", "dropped from the full queue (drop-oldest)"));
        } else {
          reject(new TernError("QUEUE_FULL", "disconnected and the queue is full"));
          return;
        }
      }
      this._outbox.push({ msg, r });
    });
  }

  /**
   * Who is subscribed to topic (on the server this client is connected
   * to), where its rule says presence=on and this client may subscribe:
   * resolves with {topic, clients, users, truncated, presence: [{client,
   * user, info}]}, at most options.limit entries (1..1000; the server's
   * most unless given), in the order they joined. Rejects with a TernError:
   * SERVER ("presence off", "forbidden"), or DISCONNECTED when not open.
   */
  presence(topic, options = {}) {
    const msg = { op: "presence", topic };
    if (options.limit !== undefined) msg.limit = String(options.limit);
    return this._ask(msg, (m) => ({ topic: m.topic, clients: m.clients, users: m.users,
                                     truncated: m.truncated, presence: m.presence }));
  }

  /** The counts alone: resolves with {topic, clients, users}; rejects as presence(). */
  presenceStats(topic) {
    return this._ask({ op: "presence_stats", topic },
                     (m) => ({ topic: m.topic, clients: m.clients, users: m.users }));
  }

  // A question answered now or never: sent on the open connection (as the
  // rate allows), its answer given to shape; never queued while
  // disconnected (the answer would be stale).
  _ask(msg, shape) {
    if (this.state === "closed") return Promise.reject(new TernError("CLOSED", "the client is closed"));
    if (typeof msg.topic !== "string" || msg.topic === "")
      return Promise.reject(new TypeError("topic: a non-empty string"));
    if (!this._socket || this._socket.readyState !== OPEN)
      return Promise.reject(new TernError("DISCONNECTED", "not connected"));
    return new Promise((resolve, reject) => {
      this._request(msg, { resolve: (m) => resolve(shape(m)), reject });
    });
  }

  /**
   * Publishes not sent yet: held while disconnected, or waiting for the
   * server's rate limit on an open connection.
   */
  get queued() {
    let n = 0;
    for (const item of this._retry) if (item.msg.op === "publish") n++;
    for (const item of this._outbox) if (item.msg.op === "publish") n++;
    return n;
  }

  /** Closes for good: the connection (1000), timers, the queue (rejected). */
  close() {
    if (this.state === "closed") return;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._closeSocket(1000, "bye");
    // the connection's requests were failed by _closeSocket; what is left
    // is the queue of publishes
    const closed = new TernError("CLOSED", "the client closed");
    for (const item of this._retry.concat(this._outbox)) item.r.reject(closed);
    this._retry = [];
    this._outbox = [];
    for (const t of this._topics.values())
      for (const s of t.subs) {
        s._closed = true;
        s._ready.reject(new TernError("CLOSED", "the client closed"));
      }
    this._topics.clear();
    if (this._browser) {
      window.removeEventListener("online", this._onOnline);
      document.removeEventListener("visibilitychange", this._onVisible);
    }
    this._setState("closed");
  }
}
