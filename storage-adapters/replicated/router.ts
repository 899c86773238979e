/**
 * Routing of etcd calls around silent members (issue 14).
 *
 * A member that is SIGSTOPped, partitioned or hung keeps its TCP connections open and answers
 * nothing; a member cut off from its peers answers, but has no leader. Either used to cost every call
 * routed to it the full request deadline. So:
 *
 * - one etcd client per member, and every call names the member it goes to: a short per-attempt
 *   deadline (`attemptTimeoutMs`), then the next member, until the call's overall deadline;
 * - every call carries etcd's require-leader metadata (`hasleader: true`): a member without a leader
 *   refuses at once (etcd's gRPC interceptors check it for unary calls and streams) instead of
 *   queueing the request until an election;
 * - gRPC keepalive, so a connection to a silent member is torn down and not reused;
 * - members that just failed, and members the health monitor sees unreachable or leaderless, are
 *   tried last; the member that answered last is tried first.
 *
 * Retrying elsewhere is safe for every request the adapter sends: reads are idempotent, and writes
 * are guarded transactions whose failure branch reads back what happened (commit-pipeline.ts).
 */
import { createRequire } from "node:module";
import { setTimeout as sleep } from "node:timers/promises";
import { Etcd3, type IOptions } from "etcd3";
import { classifyEtcdError } from "./etcd-errors.js";
import type { TxnWire } from "./txn-wire.js";

/** How long a member that failed an attempt is tried last. */
const PENALTY_MS = 3000;
/** A keep-alive is tiny: one that takes longer went to a silent member (renewals overlap anyway). */
const KEEPALIVE_ATTEMPT_MS = 1000;
/** Pause after every member failed one round (an election in progress, usually). */
const ROUND_PAUSE_MS = 100;

type Grpc = typeof import("@grpc/grpc-js");
// etcd3's own copy of grpc-js: the interceptor must come from the library that runs the calls.
const grpc = createRequire(createRequire(import.meta.url).resolve("etcd3"))("@grpc/grpc-js") as Grpc;

/** Adds etcd's require-leader metadata to every call (unary and stream). */
const requireLeader = (options: Parameters<import("@grpc/grpc-js").Interceptor>[0], nextCall: Parameters<import("@grpc/grpc-js").Interceptor>[1]) =>
  new grpc.InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      metadata.set("hasleader", "true");
      next(metadata, listener);
    },
  });

/** A policy that runs the call once: routing and retries are ours, not the client library's. */
const once = { execute: async <T>(fn: (ctx: { signal: AbortSignal; attempt: number }) => Promise<T> | T): Promise<T> => fn({ signal: new AbortController().signal, attempt: 0 }) };

/** gRPC channel options for every client of the adapter. etcd refuses pings more often than every 5 s. */
export function channelOptions(maxReceiveBytes: number): Record<string, unknown> {
  return {
    "grpc.max_receive_message_length": maxReceiveBytes,
    "grpc.keepalive_time_ms": 10000,
    "grpc.keepalive_timeout_ms": 2000,
    "grpc.keepalive_permit_without_calls": 0,
    interceptors: [requireLeader],
  };
}

/** The longest pause between a watch stream's reconnects. */
const WATCH_BACKOFF_MAX_MS = 1000;

/**
 * Watch reconnects: 100 ms, doubling, at most WATCH_BACKOFF_MAX_MS. The library's default grows to
 * 30 s, in timers that keep the process alive and that closing the client does not clear: after a
 * quorum loss a process that had closed its storage lingered for tens of seconds (found by the
 * txn-wire review, test/replicated/txn-wire-review.test.ts). Closing also empties the client's
 * watch manager (closeEtcdClient), so that no reconnect is scheduled after the one already set.
 */
function watchBackoff(delay = 100): { duration: number; next(): ReturnType<typeof watchBackoff> } {
  return { duration: delay, next: () => watchBackoff(Math.min(delay * 2, WATCH_BACKOFF_MAX_MS)) };
}

/** The client options shared by every member client (credentials, TLS, channel options, no library retries). */
export function memberClientOptions(base: Omit<IOptions, "hosts">): Omit<IOptions, "hosts"> {
  return {
    ...base,
    faultHandling: { host: () => once as never, global: once as never, watchBackoff: watchBackoff() as never },
  };
}

export interface Member {
  readonly url: string;
  readonly client: Etcd3;
  /** The commit path's own connection to this member (txn-wire.ts), or null where the etcd3 client is used (authentication). */
  readonly wire: TxnWire | null;
  penalizedUntil: number;
}

/** What the router asks the health monitor: is this member answering with a leader (undefined: not known). */
export type MemberHealth = (url: string) => boolean | undefined;

export class Router {
  readonly members: Member[];
  private preferred: Member | null = null;
  private closed = false;

  /** The deadline of one ownership lease keep-alive attempt (liveness.ts bounds it, on either client). */
  readonly keepAliveAttemptMs: number;

  constructor(
    endpoints: readonly string[],
    clientOptions: Omit<IOptions, "hosts">,
    private readonly attemptTimeoutMs: number,
    private readonly healthOf: MemberHealth,
    overallMs: number,
    wireFor: (url: string) => TxnWire | null = () => null,
    private readonly now: () => number = Date.now,
  ) {
    this.keepAliveAttemptMs = Math.min(attemptTimeoutMs, KEEPALIVE_ATTEMPT_MS);
    // Deadlines are set when the call actually starts (after authentication, which may take a while):
    // one attempt for unary calls; none for streams: watches (gRPC keepalive and the health monitor
    // watch those), the etcd3 client's own lease keep-alive loop (lease.ts: a stream that lives as long
    // as the lease; a deadline cut it every second, and it reconnected), and the ownership lease's
    // one-shot keep-alive, which bounds itself (liveness.ts). Authentication gets the whole request deadline.
    const callOptions = (c: { isStream: boolean; method: string }) =>
      c.method === "authenticate" ? { deadline: Date.now() + overallMs } : c.isStream ? {} : { deadline: Date.now() + this.attemptTimeoutMs };
    this.members = endpoints.map((url) => ({ url, client: new Etcd3({ ...clientOptions, hosts: [url], defaultCallOptions: callOptions }), wire: wireFor(url), penalizedUntil: 0 }));
  }

  /** Members in the order to try them: preferred, then healthy and unpenalized, then the rest. */
  order(): Member[] {
    const t = this.now();
    const rank = (m: Member): number => {
      const healthy = this.healthOf(m.url);
      let r = 0;
      if (m.penalizedUntil > t) r += 2;
      if (healthy === false) r += 4;
      if (m === this.preferred && r === 0) r = -1;
      return r;
    };
    const shuffled = [...this.members].sort(() => Math.random() - 0.5);
    return shuffled.sort((a, b) => rank(a) - rank(b));
  }

  /** A member to hold a stream on (a watch, the lease keep-alive): the first in `order()`. */
  pick(exclude?: Member): Member {
    const all = this.order();
    return all.find((m) => m !== exclude) ?? all[0]!;
  }

  /** Marks `m` as having failed an attempt: tried last for a while. */
  penalize(m: Member): void {
    m.penalizedUntil = this.now() + PENALTY_MS;
    if (this.preferred === m) this.preferred = null;
  }

  /**
   * Runs `op` on one member after another (each attempt bounded by the per-attempt deadline) until
   * one answers or `overallMs` has passed. Errors that are not outages (refusals, auth, too large)
   * are thrown at once; the last outage is thrown when time runs out.
   */
  async call<T>(op: (client: Etcd3, member: Member) => Promise<T>, overallMs: number): Promise<T> {
    const deadline = this.now() + overallMs;
    let last: unknown = null;
    for (;;) {
      for (const m of this.order()) {
        const remaining = deadline - this.now();
        if (remaining <= 0 || this.closed) break;
        try {
          const res = await op(m.client, m);
          this.preferred = m;
          m.penalizedUntil = 0;
          return res;
        } catch (err) {
          if (classifyEtcdError(err) !== "outage") throw err;
          this.penalize(m);
          last = err;
        }
      }
      const remaining = deadline - this.now();
      if (remaining <= 0 || this.closed) throw last ?? new Error("no etcd member answered");
      await sleep(Math.min(ROUND_PAUSE_MS, remaining));
    }
  }

  close(): void {
    this.closed = true;
    for (const m of this.members) {
      closeEtcdClient(m.client);
      m.wire?.close();
    }
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
 * stream fails, re-opens it on the closed channel every backoff period, forever. Either keeps the
 * process alive after close() (found by CI: test/replicated/txn-wire-review.test.ts, a child alive
 * 10 s after close() with four watch reconnect timers). So the manager is emptied first: its
 * watchers dropped, pending cancels ended, its stream cancelled; a reconnect timer already set then
 * fires once and finds nothing to watch. This reaches into etcd3's internals (the lockfile pins the
 * version); when they are not where 1.1.x keeps them, only `close()` is called, as before.
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
