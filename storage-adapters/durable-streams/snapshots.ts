/**
 * Snapshots on Durable Streams, and what makes opening O(tail).
 *
 * A stream cannot be rewritten, so nothing is overwritten in place: each snapshot is a new stream
 * created closed (`NAME/snap/ID`: its seq, digest, the identity segments, the text), and the index
 * stream `NAME/snaps` gets one small entry pointing at it, written last: a crash leaves the previous
 * snapshot the latest. An entry also records the snapshot's cut: an offset of the log at a record
 * boundary, at most the snapshot's seq, with the fold's state there (fold.ts), so opening reads the
 * index, the latest snapshot and the log after the cut only.
 *
 * Duplicate refusal stays exact without reading the whole log: the identities of the events before a
 * cut are in identity segments (`NAME/ids/ID`, one per snapshot that moved the cut, gzipped), and a
 * snapshot lists every segment up to its cut. An owner loads them once at open (compact: about 10 to
 * 20 bytes an identity); readers never do.
 *
 * The previous snapshot's stream is deleted once a newer entry is in the index (segments never are);
 * a reader that read the index just before finds it gone and reads the index again.
 */
import { randomBytes } from "node:crypto";
import { gunzipSync, gzipSync } from "node:zlib";
import type { StoredSnapshot } from "../../src/storage/contract.js";
import { StorageFailure } from "../../src/storage/errors.js";
import { verifiedSnapshot } from "../../src/storage/snapshots.js";
import { emptyState, type FoldState } from "./fold.js";
import { DsTransportError, START, type Wire } from "./http.js";
import type { Boundary } from "./log-view.js";
import { parseIndexEntry, parseSegmentBody, parseSnapshotBody, sha256, streamsOf, type IndexEntry, type SnapshotBody } from "./records.js";

/** A snapshot as loaded: its index entry and body (digest checked). */
export interface LoadedSnapshot {
  readonly entry: IndexEntry;
  readonly body: SnapshotBody;
}

/** The cut a snapshot-less database starts from: the beginning of the log. */
export function startBoundary(): Boundary {
  return { offset: START, state: emptyState() };
}

/** The cut of `loaded` (or the beginning). */
export function cutOf(loaded: LoadedSnapshot | null): Boundary {
  return loaded === null ? startBoundary() : { offset: loaded.entry.cut.offset, state: loaded.entry.cut.state as FoldState };
}

/** The stored form of a loaded snapshot (verified against its digest). */
export function storedOf(name: string, loaded: LoadedSnapshot | null): StoredSnapshot | null {
  return loaded === null ? null : verifiedSnapshot(name, loaded.entry.seq, loaded.body.data, loaded.entry.digest);
}

/** The index of one database, read incrementally. */
export class SnapshotIndex {
  private end = START;
  private best: IndexEntry | null = null;
  private loaded: LoadedSnapshot | null = null;

  constructor(
    private readonly wire: Wire,
    private readonly name: string,
  ) {}

  /**
   * The latest snapshot (highest seq; the later entry on a tie), its body loaded and checked, or null.
   * Returns "missing" when the index stream does not exist (no such database).
   */
  async latest(): Promise<LoadedSnapshot | null | "missing"> {
    for (let attempt = 0; ; attempt++) {
      const found = await this.readEntries();
      if (found === "missing") return "missing";
      if (this.best === null) return null;
      if (this.loaded !== null && this.loaded.entry === this.best) return this.loaded;
      const body = await this.readBody(this.best);
      if (body !== null) {
        this.loaded = { entry: this.best, body };
        return this.loaded;
      }
      // Deleted after a newer snapshot was indexed: the index has that one now.
      if (attempt >= 3) throw new StorageFailure(`database "${this.name}": the latest snapshot (seq ${this.best.seq}) named by the index is missing on the server, and no newer one appeared.`);
    }
  }

  /** Records a snapshot this process wrote (so the next `latest` need not read it back). */
  wrote(loaded: LoadedSnapshot): void {
    if (this.best === null || loaded.entry.seq >= this.best.seq) {
      this.best = loaded.entry;
      this.loaded = loaded;
    }
  }

  private async readEntries(): Promise<"ok" | "missing"> {
    for (;;) {
      const res = await this.wire.read(streamsOf(this.name).snaps, this.end);
      if (res.kind === "not-found" || res.kind === "gone") return "missing";
      if (res.kind === "timeout") return "ok";
      for (const m of res.messages) {
        const entry = parseIndexEntry(m);
        if (entry !== null && (this.best === null || entry.seq >= this.best.seq)) this.best = entry;
      }
      this.end = res.next;
      if (res.upToDate || res.messages.length === 0) return "ok";
    }
  }

  private async readBody(entry: IndexEntry): Promise<SnapshotBody | null> {
    const res = await this.wire.read(entry.path, START);
    if (res.kind === "not-found" || res.kind === "gone") return null;
    if (res.kind !== "data" || res.messages.length !== 1) throw new StorageFailure(`database "${this.name}": the snapshot stream ${entry.path} does not hold exactly one snapshot.`);
    let body: SnapshotBody;
    try {
      body = parseSnapshotBody(res.messages[0]);
    } catch (err) {
      throw new StorageFailure(`database "${this.name}": the snapshot at seq ${entry.seq} is ${(err as Error).message}; it was altered or damaged.`, { cause: err });
    }
    if (body.seq !== entry.seq || body.digest !== entry.digest) {
      throw new StorageFailure(`database "${this.name}": the snapshot stream ${entry.path} does not match its index entry (seq ${body.seq} vs ${entry.seq}); it was altered or damaged.`);
    }
    // Throws StorageFailure when the text does not match the digest taken when it was written.
    verifiedSnapshot(this.name, entry.seq, body.data, entry.digest);
    return body;
  }
}

/** Loads the identities of every segment in `paths`, checking that they cover (0, upTo] contiguously. */
export async function loadIdentities(wire: Wire, name: string, paths: readonly string[], upTo: number): Promise<Set<string>> {
  const bodies = await Promise.all(
    paths.map(async (path) => {
      const res = await wire.read(path, START);
      if (res.kind !== "data" || res.messages.length !== 1) throw new StorageFailure(`database "${name}": the identity segment ${path} is missing or damaged; duplicate refusal cannot be exact without it. Restore the database from a backup.`);
      try {
        return parseSegmentBody(res.messages[0]);
      } catch (err) {
        throw new StorageFailure(`database "${name}": the identity segment ${path} is ${(err as Error).message}.`, { cause: err });
      }
    }),
  );
  const ids = new Set<string>();
  let covered = 0;
  for (const [i, b] of bodies.entries()) {
    const json = gunzipSync(Buffer.from(b.gz, "base64")).toString("utf8");
    if (sha256(json) !== b.h || b.from !== covered) throw new StorageFailure(`database "${name}": the identity segment ${paths[i]} is damaged or out of order (it covers (${b.from}, ${b.to}], expected to start at ${covered}).`);
    const list = JSON.parse(json) as string[];
    if (list.length !== b.count || b.to - b.from !== b.count) throw new StorageFailure(`database "${name}": the identity segment ${paths[i]} does not hold the ${b.to - b.from} identities it covers.`);
    for (const id of list) ids.add(id);
    covered = b.to;
  }
  if (covered !== upTo) throw new StorageFailure(`database "${name}": the identity segments cover seqs up to ${covered}, but the snapshot's cut is at ${upTo}.`);
  return ids;
}

/** A random id for a new stream path (its name must not collide with a racing writer's). */
export function streamId(seq: number): string {
  return `${String(seq).padStart(12, "0")}-${randomBytes(6).toString("hex")}`;
}

/** Writes the identity segment for the events (from, to] and returns its path. */
export async function writeSegment(wire: Wire, name: string, from: number, to: number, identities: readonly string[]): Promise<string> {
  if (identities.length !== to - from) throw new StorageFailure(`database "${name}": cannot write the identity segment (${from}, ${to}]: ${identities.length} identities at hand.`);
  const json = JSON.stringify(identities);
  const path = streamsOf(name).ids(streamId(to));
  const body = JSON.stringify({ v: 1, from, to, count: identities.length, h: sha256(json), gz: gzipSync(json).toString("base64") });
  await createWithRetry(wire, path, body);
  return path;
}

/** Writes a snapshot body stream and returns its path. */
export async function writeSnapshotBody(wire: Wire, name: string, body: SnapshotBody): Promise<string> {
  const path = streamsOf(name).snap(streamId(body.seq));
  await createWithRetry(wire, path, JSON.stringify(body));
  return path;
}

/** Creates a closed stream holding `body`; a lost answer is retried (creating it again is idempotent). */
async function createWithRetry(wire: Wire, path: string, body: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await wire.create(path, { body, closed: true });
      return;
    } catch (err) {
      if (!(err instanceof DsTransportError) || attempt >= 5) throw err;
      await new Promise((r) => setTimeout(r, 100 * 2 ** attempt));
    }
  }
}
