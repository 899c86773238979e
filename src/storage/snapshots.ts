/**
 * What every adapter shares about snapshots and about decoding its own events, and the one way to
 * open a projection: the latest snapshot plus the events after it.
 *
 * Decoding: an event the adapter validated with zod before writing it is not parsed with zod again
 * on every read. Instead its stored bytes carry an integrity check (a CRC-32 per sqlite row; the
 * replicated adapter's sha256 hash chain, verified when the local copy is opened), and decoding
 * checks the envelope's shape only (`decodeOwnEvent`). Rows without a check (written by an older
 * release), events from outside and `validate: "full"` reads go through the full zod parse.
 */
import { createHash } from "node:crypto";
import { crc32 } from "node:zlib";
import { EVENT_KINDS, parseLogEvent, type EventKind, type LogEvent } from "../state/events.js";
import { Reducer } from "../state/reducer.js";
import { restoreSnapshot } from "../state/snapshot.js";
import type { StoredSnapshot } from "./contract.js";
import { StorageFailure, StorageRejected } from "./errors.js";

const KINDS = new Set<string>(EVENT_KINDS);

/** The digest adapters store with a snapshot: sha256 of its text, hex. */
export function snapshotDigest(data: string): string {
  return createHash("sha256").update(data).digest("hex");
}

/**
 * Checks a `writeSnapshot(seq, data)` call against the log head and the latest snapshot's seq;
 * throws StorageRejected `invalid` with a sentence saying what to pass instead.
 */
export function checkSnapshotWrite(name: string, seq: number, data: string, head: number, latestSeq: number): void {
  if (!Number.isSafeInteger(seq) || seq < 1 || seq > head) {
    throw new StorageRejected("invalid", `writeSnapshot on database "${name}": seq must be a committed seq between 1 and the head ${head}, got ${String(seq)}.`);
  }
  if (seq < latestSeq) {
    throw new StorageRejected("invalid", `writeSnapshot on database "${name}": seq ${seq} is below the latest snapshot's seq ${latestSeq}; snapshots only move forward.`);
  }
  if (typeof data !== "string" || data.length === 0) {
    throw new StorageRejected("invalid", `writeSnapshot on database "${name}": the snapshot text must be a non-empty string.`);
  }
}

/** Returns the snapshot when its digest matches, else throws StorageFailure naming it. */
export function verifiedSnapshot(name: string, seq: number, data: string, digest: string): StoredSnapshot {
  if (snapshotDigest(data) !== digest) {
    throw new StorageFailure(`database "${name}": the snapshot at seq ${seq} does not match its digest; it was altered or damaged. Restore the database from a replica or backup.`);
  }
  return { seq, data, verified: true };
}

/** The CRC-32 an adapter stores with an event row: over the envelope fields and the body JSON. */
export function eventCrc(identity: string, kind: string, session: string, at: string, bodyJson: string): number {
  return crc32(`${identity}\n${kind}\n${session}\n${at}\n${bodyJson}`);
}

/**
 * Decodes an event the adapter wrote itself (validated before the write, integrity checked by the
 * caller): JSON.parse of the body and a shape check of the envelope, no zod. Throws an Error saying
 * what is wrong when the row is not an event at all.
 */
export function decodeOwnEvent(seq: number, identity: string, kind: string, session: string, at: string, bodyJson: string): LogEvent {
  return ownEvent(seq, identity, kind, session, at, JSON.parse(bodyJson) as unknown);
}

/** As decodeOwnEvent, for a body already parsed. */
export function ownEvent(seq: number, identity: unknown, kind: unknown, session: unknown, at: unknown, body: unknown): LogEvent {
  if (typeof kind !== "string" || !KINDS.has(kind)) throw new Error(`unknown event kind ${JSON.stringify(kind)}`);
  if (typeof identity !== "string" || identity === "" || typeof session !== "string" || session === "" || typeof at !== "string" || at === "") {
    throw new Error("identity, session and at must be non-empty strings");
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("the body is not an object");
  return { seq, identity, kind: kind as EventKind, session, at, body } as LogEvent;
}

/** Validates one stored event fully (zod), for rows without an integrity check and reads on demand. */
export function decodeValidated(seq: number, identity: string, kind: string, session: string, at: string, bodyJson: string): LogEvent {
  return parseLogEvent({ seq, identity, kind, session, at, body: JSON.parse(bodyJson) as unknown });
}

/** Where a projection is loaded from: an owned Database or a Reader. */
export interface ProjectionSource {
  readonly name: string;
  latestSnapshot(): Promise<StoredSnapshot | null>;
  read(afterSeq?: number, limit?: number): Promise<LogEvent[]>;
}

/** Events read per page while folding the tail. */
const PAGE = 5000;

/**
 * Opens the projection of `source`: restores its latest snapshot (its structure checked when the
 * adapter verified its digest, else validated against the full schema) and folds the events
 * after it, page by page. Resume cost depends on the tail, not on the run's age. Throws
 * StorageFailure when the snapshot is damaged or does not restore, and what `read` throws.
 */
export async function loadProjection(source: ProjectionSource): Promise<Reducer> {
  const snapshot = await source.latestSnapshot();
  let reducer: Reducer;
  if (snapshot === null) reducer = new Reducer();
  else {
    try {
      // A snapshot whose digest the adapter checked is the exact text this code encoded from a
      // folded projection: its structure is checked, not every field against the schema.
      reducer = restoreSnapshot(snapshot.data, snapshot.seq, { validate: snapshot.verified === true ? "structure" : "full" });
    } catch (cause) {
      throw new StorageFailure(`database "${source.name}": ${(cause as Error).message}. Restore the database from a replica or backup.`, { cause });
    }
  }
  for (;;) {
    const batch = await source.read(reducer.headSeq, PAGE);
    if (batch.length === 0) return reducer;
    reducer.apply(batch);
    if (batch.length < PAGE) return reducer;
  }
}

/** When the harness writes a snapshot: every `events` events or `bytes` bytes of events, whichever first. */
export interface SnapshotPolicy {
  readonly events: number;
  readonly bytes: number;
}

/** The default: every 10,000 events or 8 MiB of event JSON. */
export const DEFAULT_SNAPSHOT_POLICY: SnapshotPolicy = { events: 10_000, bytes: 8 * 1024 * 1024 };

/** Counts events and bytes committed since the last snapshot and says when the next one is due. */
export class SnapshotSchedule {
  private events = 0;
  private bytes = 0;

  constructor(private readonly policy: SnapshotPolicy) {}

  /** Records a committed batch of `events` events whose JSON is about `bytes` bytes long. */
  record(events: number, bytes: number): void {
    this.events += events;
    this.bytes += bytes;
  }

  /** True when a snapshot is due. */
  due(): boolean {
    return this.events >= this.policy.events || this.bytes >= this.policy.bytes;
  }

  /** Starts counting again (after a snapshot was written). */
  reset(): void {
    this.events = 0;
    this.bytes = 0;
  }
}
