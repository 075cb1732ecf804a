// Types of tern-client (tern-client.js).

export type State = "idle" | "connecting" | "open" | "reconnecting" | "closed";

export type ErrorCode =
  | "SERVER"          // the server refused the request: message is its error ("forbidden", ...)
  | "SUBSCRIBE"       // a subscription refused (its ready rejects; it is removed)
  | "DISCONNECTED"    // the connection ended (a publish in flight may or may not have been published)
  | "QUEUE_FULL"      // disconnected and the queue is full (reject-new), or queueMax is 0
  | "DROPPED"         // refused to make room in the queue (drop-oldest)
  | "CLOSED"          // the client was closed
  | "TOKEN"           // getToken failed, or the server refused the new token
  | "TOKEN_EXPIRED"   // the server closed the connection at the token's exp (4001)
  | "NO_WEBSOCKET"    // neither a global WebSocket nor the ws package
  | "CONNECT"         // an attempt failed before it opened (refused, unreachable, an HTTP status such
                      // as 401 instead of 101): once per attempt; detail {code, reason, status?}
  | "PROTOCOL";       // the server sent something that is not JSON

export class TernError extends Error {
  readonly code: ErrorCode;
  readonly detail?: unknown;
}

export interface ClientOptions {
  /** A JWT for ?token=; or getToken, asked before connecting, before exp and after a refusal. */
  token?: string;
  getToken?: () => Promise<string>;
  /** The first retry waits up to this (ms, default 250); each one doubles it, up to backoffMax (10000). */
  backoffInitial?: number;
  backoffMax?: number;
  /** A new token this long before exp (ms, default 30000), and at least half-way through its life. */
  refreshMargin?: number;
  /** Publishes held while disconnected (default 1000; 0: none). */
  queueMax?: number;
  /**
   * Messages a second to keep to when the server does not say its own
   * (default 100, tern serve's --pubsub-rate default; 0: no pacing). A
   * server that answers {"op":"limits"} is kept to its rate instead.
   */
  rate?: number;
  /** When the queue is full: refuse the new publish (default) or the oldest held. */
  queuePolicy?: "reject-new" | "drop-oldest";
  /** A WebSocket class to use instead of the global one or the ws package. */
  WebSocket?: unknown;
  /**
   * The transports tried, in this order (default ["websocket",
   * "http-stream"]): "http-stream" is tern serve's /http-stream. Until a
   * connection has opened, fallbackAfter WebSocket attempts that never
   * opened are followed by one on the next transport, and again; the
   * first transport that opens stays.
   */
  transports?: Transport[];
  /** WebSocket attempts that never opened before one on the next transport (default 2). */
  fallbackAfter?: number;
  /** A fetch to use for http-stream instead of the global one (its body must stream). */
  fetch?: typeof globalThis.fetch;
  /** false: do not connect until connect() is called. */
  connect?: boolean;
  /** The jitter's random numbers in [0, 1) (default Math.random). */
  random?: () => number;
}

export type Transport = "websocket" | "http-stream";

export interface Message {
  topic: string;
  seq: number;
  /** The key it was published with, when it had one. */
  key?: string;
  /** The data as published (a string; the feed's are JSON). */
  data: string;
  /** Part of a snapshot: the latest message of its key, sent at a (re)subscription. */
  snapshot: boolean;
}

export interface SubscribedInfo {
  topic: string;
  /** The topic's epoch on this server (16 hex digits): one run of its numbering. */
  epoch: string;
  /** Where the stream stands: the seq of the last message before the live ones. */
  seq: number;
  /** After a resume: true when nothing was missed; false when there was a gap. */
  resumed?: boolean;
  /** resumed === false: messages were missed, the snapshot that follows replaces them. */
  gap: boolean;
  /** Messages sent before the ack (missed ones, or the snapshot). */
  replayed: number;
  /** The first subscription of the topic (not a resume). */
  first: boolean;
}

export interface SubscribeOptions {
  /** Start with the latest message of each key (default true). */
  snapshot?: boolean;
  /** At every (re)subscription, before the messages it brings. */
  onSubscribed?: (info: SubscribedInfo, sub: Subscription) => void;
  /** Another client subscribed (the topic's rule says join-leave=on). */
  onJoin?: (ev: PresenceEvent, sub: Subscription) => void;
  /** Another client unsubscribed or its connection ended. */
  onLeave?: (ev: PresenceEvent, sub: Subscription) => void;
  /**
   * The server ended the subscription (its operator's POST /unsubscribe):
   * the handler gets nothing more, and the topic is not subscribed again
   * on a reconnect.
   */
  onUnsubscribed?: (sub: Subscription) => void;
}

/** One client in a topic: its connection's id, its token's sub ("" without one) and info claim. */
export interface PresenceEntry {
  client: string;
  user: string;
  info?: unknown;
}

/** A join or a leave: the entry and its topic. */
export interface PresenceEvent extends PresenceEntry {
  topic: string;
}

export interface PresenceStats {
  topic: string;
  /** Connections subscribed. */
  clients: number;
  /** Distinct users among them (a user with two connections counts once). */
  users: number;
}

export interface Presence extends PresenceStats {
  /** Some clients were left out (over the limit). */
  truncated: boolean;
  /** In the order they joined. */
  presence: PresenceEntry[];
}

export interface Subscription {
  readonly topic: string;
  /**
   * The latest message of each key. A snapshot (a new subscription's, or
   * the one after a gap) replaces it whole before onSubscribed and the
   * first handler call: keys the server no longer has are removed.
   */
  readonly latest: Map<string, Message>;
  /** Resolves at the first ack; rejects when the subscription is refused. */
  readonly ready: Promise<SubscribedInfo>;
  unsubscribe(): void;
}

export class TernClient {
  constructor(url: string, options?: ClientOptions);
  readonly url: string;
  readonly state: State;
  /** The transport of the connection open (or last open); null before one opened. */
  readonly transport: Transport | null;
  /** Publishes not sent yet: held while disconnected, or waiting for the server's rate. */
  readonly queued: number;
  on(event: "state", fn: (state: State, previous: State) => void): () => void;
  on(event: "error", fn: (error: TernError) => void): () => void;
  on(event: "join" | "leave", fn: (ev: PresenceEvent) => void): () => void;
  /** A connection opened on another transport than the last one (the first one too). */
  on(event: "transport", fn: (transport: Transport) => void): () => void;
  connect(): void;
  reconnect(): void;
  subscribe(topic: string, handler: (msg: Message, sub: Subscription) => void,
            options?: SubscribeOptions): Subscription;
  publish(topic: string, data: string, options?: { key?: string }): Promise<number>;
  /** Who is in topic (this server's subscribers), at most options.limit (1..1000). */
  presence(topic: string, options?: { limit?: number }): Promise<Presence>;
  presenceStats(topic: string): Promise<PresenceStats>;
  close(): void;
}

export function backoffDelay(attempt: number, initial: number, max: number,
                             random?: () => number): number;
export function tokenExp(token: string): number | undefined;
