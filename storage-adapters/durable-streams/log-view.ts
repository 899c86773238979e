/**
 * One handle's view of a database's log stream: the fold's state at the offset it has read up to
 * (`end`), the events of the records after its cache start (the cut it opened from: the latest
 * snapshot's, or the stream's beginning), and the offsets it knows the fold's state at (the ends of
 * its reads and of its own appends), from which a snapshot's cut is chosen.
 *
 * Offsets are opaque (PROTOCOL.md section 8): the adapter only stores the ones the server handed out
 * (a read's or an append's Stream-Next-Offset) and reads from them again.
 */
import { CairnError } from "../../src/errors.js";
import type { LogEvent } from "../../src/state/events.js";
import { ResetError, StorageFailure, StorageRejected, StorageUnavailable } from "../../src/storage/errors.js";
import { ownEvent } from "../../src/storage/snapshots.js";
import { applyRecord, cloneState, LogDiverged, type Applied, type FoldState } from "./fold.js";
import { DsProtocolError, DsTransportError, START, type Wire } from "./http.js";
import { parseLogRecord, type LogRecord } from "./records.js";

/** An offset and the fold's state there. */
export interface Boundary {
  readonly offset: string;
  readonly state: FoldState;
}

/** A counted commit record, as cached: its events' JSON text and where they start. */
interface Cached {
  readonly f: number;
  readonly c: number;
  readonly ev: string;
  readonly h: string;
}

/** How many recent boundaries a view remembers (snapshot cuts are chosen among them). */
const BOUNDARIES = 64;

/** A promise chain: one holder at a time, in call order. */
export class Lock {
  private tail: Promise<void> = Promise.resolve();

  run<T>(body: () => Promise<T>): Promise<T> {
    const result = this.tail.then(body);
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}

/** Maps a failed read of database `name`'s streams to the Storage errors. */
export function readFailure(name: string, what: string, err: unknown): CairnError {
  if (err instanceof CairnError) return err;
  if (err instanceof DsTransportError) return new StorageUnavailable(`database "${name}": ${what}: the Durable Streams server did not answer (${err.message}); retry when it is reachable.`, { cause: err });
  if (err instanceof LogDiverged) return new StorageFailure(`database "${name}": ${err.message}`, { cause: err });
  if (err instanceof DsProtocolError) return new StorageFailure(`database "${name}": ${what}: ${err.message}`, { cause: err });
  return new StorageFailure(`database "${name}": ${what}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
}

/** The view. Every mutation of `state`/`end` happens under `lock`. */
export class LogView {
  state: FoldState;
  end: string;
  readonly lock = new Lock();
  private cacheStart: Boundary;
  private cache: Cached[] = [];
  private boundaries: Boundary[] = [];
  /** Called with every record applied (own appends and reads): the owner watches for newer epochs. */
  onApplied: ((record: LogRecord, applied: Applied) => void) | null = null;

  constructor(
    private readonly wire: Wire,
    readonly name: string,
    private readonly path: string,
    start: Boundary,
  ) {
    this.state = cloneState(start.state);
    this.end = start.offset;
    this.cacheStart = { offset: start.offset, state: cloneState(start.state) };
    this.remember();
  }

  /** The fold's state at the cache start (its head is the first seq the cache cannot serve below). */
  get cacheHead(): number {
    return this.cacheStart.state.head;
  }

  /** Reads and folds everything after `end` (to the server's tail). Takes the lock. */
  catchUp(signal?: AbortSignal): Promise<void> {
    return this.lock.run(() => this.catchUpLocked(signal));
  }

  /** As catchUp, for a caller that holds the lock. */
  async catchUpLocked(signal?: AbortSignal): Promise<void> {
    for (;;) {
      const res = await this.wire.read(this.path, this.end, false, signal);
      if (res.kind === "not-found" || res.kind === "gone") {
        throw new ResetError("stop", "deleted", `database "${this.name}": its log stream ${this.wire.url(this.path)} is gone (deleted on the server); this handle cannot continue.`);
      }
      if (res.kind === "timeout") return;
      this.applyMessages(res.messages, res.next);
      // Read until a read answers nothing: "up to date" alone is not trusted, because a server that
      // cannot return what lies after this answer (http.ts: a damaged stream file) says it too; the
      // empty answer's offset then shows it.
      if (res.messages.length === 0) return;
    }
  }

  /**
   * True when `next`, the offset a server answered an append of this handle with, does not lie after
   * everything this view has read: the server no longer holds (lost or rewound) data it returned.
   * Reads only end at a tail the server has counted (http.ts), so this never holds on a server that
   * keeps what it returned. Hold the lock.
   */
  rewoundBefore(next: string): boolean {
    return this.end !== START && next <= this.end;
  }

  /** Applies a record this handle appended itself and that the server answered with offset `next`. Hold the lock. */
  applyOwn(record: LogRecord, next: string): Applied {
    const applied = this.apply(record);
    this.end = next;
    this.remember();
    return applied;
  }

  /** True when a commit starting at seq `f` whose events have digest `h` is counted (and cached). */
  counts(f: number, h: string): boolean {
    let lo = 0;
    let hi = this.cache.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.cache[mid]!.f < f) lo = mid + 1;
      else hi = mid;
    }
    const r = this.cache[lo];
    return r !== undefined && r.f === f && r.h === h;
  }

  /**
   * The events with seq > afterSeq (at most `limit`), from the cache. The caller caught up first and
   * checked `afterSeq >= cacheHead`.
   */
  cachedEvents(afterSeq: number, limit: number | undefined): LogEvent[] {
    const out: LogEvent[] = [];
    let lo = 0;
    let hi = this.cache.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const r = this.cache[mid]!;
      if (r.f + r.c - 1 <= afterSeq) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < this.cache.length; i++) {
      if (limit !== undefined && out.length >= limit) break;
      const r = this.cache[i]!;
      decodeInto(this.name, r, afterSeq, limit, out);
    }
    return out;
  }

  /**
   * Events with seq > afterSeq (at most `limit`) read from the beginning of the stream, for a read
   * below the cache start. O(log): what `cairn log` and the timeline do when they show everything.
   */
  async eventsFromStart(afterSeq: number, limit: number | undefined): Promise<LogEvent[]> {
    const state: FoldState = { head: 0, maxEpoch: 0, frames: [] };
    const out: LogEvent[] = [];
    const kept: Cached[] = [];
    let offset = START;
    for (;;) {
      const res = await this.wire.read(this.path, offset, false);
      if (res.kind === "not-found") throw new ResetError("stop", "deleted", `database "${this.name}": its log stream is gone (deleted on the server).`);
      if (res.kind === "gone") {
        throw new StorageRejected("compacted", `database "${this.name}": the Durable Streams server no longer holds the beginning of the log (retention); read from the latest snapshot's seq instead.`);
      }
      if (res.kind === "timeout") break;
      for (const message of res.messages) {
        const record = this.parse(message);
        const applied = applyRecord(state, record);
        for (const p of applied.popped) if (p.t === "commit") kept.pop();
        if (record.t === "commit") kept.push({ f: record.f, c: record.c, ev: record.ev, h: record.h });
      }
      offset = res.next;
      if (res.messages.length === 0) break;
    }
    for (const r of kept) {
      if (r.f + r.c - 1 <= afterSeq) continue;
      if (limit !== undefined && out.length >= limit) break;
      decodeInto(this.name, r, afterSeq, limit, out);
    }
    return out;
  }

  /** The latest known boundary whose head is at most `seq` (the cache start at worst). */
  boundaryAtOrBelow(seq: number): Boundary {
    for (let i = this.boundaries.length - 1; i >= 0; i--) {
      const b = this.boundaries[i]!;
      if (b.state.head <= seq) return b;
    }
    return this.cacheStart;
  }

  /** The identities of the cached events with seq in (from, to], in order. */
  identitiesBetween(from: number, to: number): string[] {
    const out: string[] = [];
    for (const r of this.cache) {
      if (r.f + r.c - 1 <= from) continue;
      if (r.f > to) break;
      const events = JSON.parse(r.ev) as { identity: string }[];
      events.forEach((e, i) => {
        const seq = r.f + i;
        if (seq > from && seq <= to) out.push(e.identity);
      });
    }
    return out;
  }

  /** Every identity of the cached events. */
  cachedIdentities(): string[] {
    return this.identitiesBetween(this.cacheStart.state.head, Number.MAX_SAFE_INTEGER);
  }

  /** Drops the cache before `cut` (a snapshot now covers it). */
  trimTo(cut: Boundary): void {
    if (cut.state.head <= this.cacheStart.state.head) return;
    this.cache = this.cache.filter((r) => r.f > cut.state.head);
    this.cacheStart = { offset: cut.offset, state: cloneState(cut.state) };
    this.boundaries = this.boundaries.filter((b) => b.state.head >= cut.state.head);
  }

  private applyMessages(messages: readonly unknown[], next: string): void {
    for (const message of messages) this.apply(this.parse(message));
    this.end = next;
    this.remember();
  }

  private parse(message: unknown): LogRecord {
    try {
      return parseLogRecord(message);
    } catch (err) {
      throw new StorageFailure(`database "${this.name}": the log stream holds a message that is ${(err as Error).message}; the stream was altered or damaged.`, { cause: err });
    }
  }

  private apply(record: LogRecord): Applied {
    let applied: Applied;
    try {
      applied = applyRecord(this.state, record);
    } catch (err) {
      throw readFailure(this.name, "folding its log", err);
    }
    for (const p of applied.popped) if (p.t === "commit") this.cache.pop();
    if (record.t === "commit") this.cache.push({ f: record.f, c: record.c, ev: record.ev, h: record.h });
    this.onApplied?.(record, applied);
    return applied;
  }

  private remember(): void {
    this.boundaries.push({ offset: this.end, state: cloneState(this.state) });
    if (this.boundaries.length > BOUNDARIES) this.boundaries.splice(0, this.boundaries.length - BOUNDARIES);
  }
}

/** Decodes the events of cached record `r` with seq > afterSeq into `out` (up to `limit` in all). */
function decodeInto(name: string, r: Cached, afterSeq: number, limit: number | undefined, out: LogEvent[]): void {
  let events: unknown;
  try {
    events = JSON.parse(r.ev);
  } catch (cause) {
    throw new StorageFailure(`database "${name}": the commit at seq ${r.f} holds events that are not JSON.`, { cause });
  }
  if (!Array.isArray(events) || events.length !== r.c) throw new StorageFailure(`database "${name}": the commit at seq ${r.f} does not hold the ${r.c} events it says.`);
  for (let i = 0; i < events.length; i++) {
    const seq = r.f + i;
    if (seq <= afterSeq) continue;
    if (limit !== undefined && out.length >= limit) return;
    const e = events[i] as { identity?: unknown; kind?: unknown; session?: unknown; at?: unknown; body?: unknown };
    try {
      out.push(ownEvent(seq, e.identity, e.kind, e.session, e.at, e.body));
    } catch (cause) {
      throw new StorageFailure(`database "${name}": the stored event at seq ${seq} is not a valid event (${(cause as Error).message}).`, { cause });
    }
  }
}
