/**
 * The adapter's one etcd client stack: the `etcd3` package on @grpc/grpc-js, one client per member
 * (router.ts), for every call: commits, reads, watches, leases, authentication and member status.
 * Authenticated and anonymous deployments take the same path (the client handles the tokens).
 *
 * What each client is given, and why:
 * - etcd's require-leader metadata (`hasleader: true`) on every call, unary and stream: a member cut
 *   off from its peers refuses at once (etcd checks it in its gRPC interceptors) instead of queueing
 *   the request until an election. Not on the health monitor's status polls: a member without a
 *   leader still answers those, and that is what they ask.
 * - gRPC keepalive (a PING every 10 s, dropped after 2 s without its answer), so a connection to a
 *   silent member is torn down and not reused. etcd refuses pings more often than every 5 s.
 * - no retries of the library's own: routing and retries are the router's (one attempt per member).
 * - the adapter's watch reconnect pause (retry.ts) instead of the library's, which grows to 30 s.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Etcd3, GRPCDeadlineExceededError, GRPCUnavailableError, castGrpcError, type IDuplexStream, type IOptions } from "etcd3";
import { ConfigError } from "../../src/errors.js";
import { Backoff } from "./retry.js";

/** Largest gRPC message we accept (a page of log records). */
export const MAX_RECEIVE_BYTES = 64 * 1024 * 1024;

type Grpc = typeof import("@grpc/grpc-js");
type Interceptor = import("@grpc/grpc-js").Interceptor;
// etcd3's own copy of grpc-js: the interceptor must come from the library that runs the calls.
const grpc = createRequire(createRequire(import.meta.url).resolve("etcd3"))("@grpc/grpc-js") as Grpc;

/** Adds etcd's require-leader metadata to every call (unary and stream). */
const requireLeader: Interceptor = (options, nextCall) =>
  new grpc.InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      metadata.set("hasleader", "true");
      next(metadata, listener);
    },
  });

/** A policy that runs the call once: routing and retries are ours, not the client library's. */
const once = { execute: async <T>(fn: (ctx: { signal: AbortSignal; attempt: number }) => Promise<T> | T): Promise<T> => fn({ signal: new AbortController().signal, attempt: 0 }) };

/** How a client reaches the members: credentials and TLS material (PEM bytes), all optional. */
export interface Connection {
  readonly username?: string;
  readonly password?: string;
  readonly tls?: { readonly ca: Buffer; readonly cert?: Buffer; readonly key?: Buffer } | null;
}

/** Reads a TLS file named by option `tls.<which>`; a ConfigError naming the option and the path when it cannot. */
function readPem(path: string, which: "ca" | "cert" | "key"): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code ?? String(err);
    throw new ConfigError(`replicated storage option "tls.${which}" (or CAIRN_ETCD_${which.toUpperCase()}): cannot read ${path} (${reason})`, { cause: err });
  }
}

/** The connection settings of the options, the PEM files read once (ConfigError when one cannot be). */
export function connectionOf(opts: { username?: string; password?: string; tls?: { ca: string; cert?: string; key?: string } }): Connection {
  const tls = opts.tls ? { ca: readPem(opts.tls.ca, "ca"), ...(opts.tls.cert ? { cert: readPem(opts.tls.cert, "cert") } : {}), ...(opts.tls.key ? { key: readPem(opts.tls.key, "key") } : {}) } : null;
  return { ...(opts.username !== undefined && opts.password !== undefined ? { username: opts.username, password: opts.password } : {}), tls };
}

/** The etcd3 client options every client of the adapter shares (see the file comment); `hosts` and deadlines are per client. */
export function clientOptions(conn: Connection, withLeader = true): Omit<IOptions, "hosts"> {
  return {
    ...(conn.username !== undefined && conn.password !== undefined ? { auth: { username: conn.username, password: conn.password } } : {}),
    ...(conn.tls ? { credentials: { rootCertificate: conn.tls.ca, ...(conn.tls.key ? { privateKey: conn.tls.key } : {}), ...(conn.tls.cert ? { certChain: conn.tls.cert } : {}) } } : {}),
    grpcOptions: {
      "grpc.max_receive_message_length": MAX_RECEIVE_BYTES,
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 2000,
      "grpc.keepalive_permit_without_calls": 0,
      ...(withLeader ? { interceptors: [requireLeader] } : {}),
    } as IOptions["grpcOptions"],
    faultHandling: { host: () => once as never, global: once as never, watchBackoff: new Backoff() as never },
  };
}

/**
 * A client of the one member `url`. Deadlines are set when a call actually starts (after
 * authentication, which may take a while): `attemptMs` for unary calls; the whole `overallMs` for
 * authentication; none for streams: watches (gRPC keepalive and the health monitor watch those), the
 * owner lease's keep-alive loop (lease.ts: a stream as long as the lease), and the ownership lease's
 * one-shot keep-alives, which bound themselves (keepAliveOnce).
 */
export function memberClient(url: string, options: Omit<IOptions, "hosts">, attemptMs: number, overallMs = attemptMs): Etcd3 {
  return new Etcd3({
    ...options,
    hosts: [url],
    defaultCallOptions: (c) => (c.method === "authenticate" ? { deadline: Date.now() + overallMs } : c.isStream ? {} : { deadline: Date.now() + attemptMs }),
  });
}

/**
 * One keep-alive of lease `id` on `client`'s member within `timeoutMs` (an outage after it: the
 * stream is cancelled). Resolves with the TTL etcd reports (<= 0: gone).
 */
export async function keepAliveOnce(client: Etcd3, id: string, timeoutMs: number): Promise<number> {
  type Stream = IDuplexStream<{ ID: string }, { TTL: string }>;
  let timer: NodeJS.Timeout | undefined;
  let timedOut = false;
  let stream: Stream | null = null;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      timedOut = true;
      stream?.cancel();
      reject(new GRPCDeadlineExceededError(`no lease keep-alive answer within ${timeoutMs} ms`));
    }, timeoutMs);
  });
  const answered = (async () => {
    const s = (await client.leaseClient.leaseKeepAlive()) as unknown as Stream;
    if (timedOut) {
      s.cancel(); // opened after the deadline: nobody waits for it
      throw new GRPCDeadlineExceededError(`no lease keep-alive stream within ${timeoutMs} ms`);
    }
    stream = s;
    return new Promise<number>((resolve, reject) => {
      s.on("data", (res) => resolve(Number(res.TTL)));
      s.on("error", (err: Error) => reject(castGrpcError(err)));
      s.on("end", () => reject(new GRPCUnavailableError("the lease keep-alive stream ended without an answer")));
      s.write({ ID: id });
    });
  })();
  try {
    return await Promise.race([expired, answered]);
  } finally {
    clearTimeout(timer);
    if (!timedOut) (stream as Stream | null)?.end();
  }
}

/** The part of etcd3's (1.1.x) internal WatchManager that closeEtcdClient touches. */
interface WatchManagerInternals {
  state: number;
  handleResponse: (res: unknown) => void;
  handleCreatedResponse: (res: unknown) => void;
  watchers: unknown[];
  expectedClosers: Set<{ emit(event: "end"): boolean }>;
  stream?: { cancel(): void };
}

function watchManagerOf(client: Etcd3): WatchManagerInternals | null {
  const wm = (client as unknown as { watchManager?: Partial<WatchManagerInternals> }).watchManager;
  if (wm === undefined || !Array.isArray(wm.watchers) || !(wm.expectedClosers instanceof Set) || typeof wm.state !== "number") return null;
  if (typeof wm.handleResponse !== "function" || typeof wm.handleCreatedResponse !== "function") return null;
  return wm as WatchManagerInternals;
}

/**
 * Closes an etcd3 client so that none of its watches keeps the process alive.
 *
 * `Etcd3.close()` closes the gRPC channel but leaves the client's watch manager as it was: a watcher
 * still attached (one whose cancel had not been answered when the adapter stopped waiting for it, a
 * bounded wait because its member may be silent: watch.ts) keeps its stream open, or, once that
 * stream fails, re-opens it on the closed channel every backoff period, forever
 * (test/replicated/client-close.test.ts). So the manager is emptied first: its watchers dropped,
 * pending cancels ended, its stream cancelled; a reconnect timer already set then fires once and finds
 * nothing to watch. This reaches into etcd3's internals (the lockfile pins the version); when they are
 * not where 1.1.x keeps them, only `close()` is called.
 */
export function closeEtcdClient(client: Etcd3): void {
  const wm = watchManagerOf(client);
  if (wm !== null) {
    // A reply already being decoded is still delivered after the cancel below (grpc-js), and the
    // manager throws on a reply for a watcher it no longer has (an unhandled rejection): from here
    // on, replies are dropped.
    wm.handleResponse = () => undefined;
    wm.handleCreatedResponse = () => undefined;
    wm.watchers = [];
    const closers = [...wm.expectedClosers];
    wm.expectedClosers.clear();
    for (const w of closers) w.emit("end");
    // 2 is etcd3's State.Connected: only then does the manager hold a live stream.
    if (wm.state === 2 && wm.stream !== undefined) wm.stream.cancel();
  }
  client.close();
}

/** Resolves `p`, or rejects with `onTimeout()` after `ms` (the timer never keeps the process alive). */
export function withTimeout<T>(p: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), ms);
    timer.unref();
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}
