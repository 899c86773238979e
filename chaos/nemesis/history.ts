/**
 * The nemesis history: one JSON object per line, appended by every process of a run (the controller,
 * the nemesis, each worker) to one file opened with O_APPEND, each record in a single write(2), so
 * that the file's order is a real-time order of the records' writes. The checker reads only this file,
 * the final logs and the effect files.
 *
 * A worker writes a commit's `invoke` before handing the batch to storage and its `ok`/`fail` after
 * the storage answered and before the harness acts on the answer; a commit with an `invoke` and no
 * answer (the process died) is uncertain, as is a `fail` whose error does not say it was refused.
 */
import { closeSync, openSync, writeSync } from "node:fs";

/** One event of a committed batch, as the history records it. */
export interface HEvent {
  readonly kind: string;
  readonly identity: string;
  readonly session: string;
  /** The cell of execution events. */
  readonly cell?: number;
}

export type HRecord =
  | { type: "run"; seed: number; profile: string; dbs: { name: string; adapter: string }[]; at: number }
  | { type: "spawn"; db: string; worker: string; pid: number; role: "scheduled" | "racer"; env?: Record<string, string>; at: number }
  | { type: "exit"; db: string; worker: string; pid: number; code: number | null; signal: string | null; at: number }
  | { type: "open"; db: string; worker: string; pid: number; epoch: number; head: number; at: number }
  | { type: "open-failed"; db: string; worker: string; pid: number; error: string; at: number }
  | { type: "invoke"; db: string; worker: string; epoch: number; op: number; events: HEvent[]; at: number }
  | { type: "ok"; db: string; worker: string; epoch: number; op: number; firstSeq: number; lastSeq: number; at: number }
  | { type: "fail"; db: string; worker: string; epoch: number; op: number; outcome: "refused" | "uncertain"; code: string; reason: string | null; message: string; at: number }
  | { type: "fenced"; db: string; worker: string; epoch: number; by: number | null; at: number }
  | { type: "submit"; db: string; req: string; at: number }
  | { type: "post"; db: string; session: string; id: string; outcome: "ok" | "refused" | "failed"; error?: string; at: number }
  | { type: "fault"; n: number; kind: string; target: string; phase: "begin" | "end"; detail?: string; at: number }
  | { type: "final"; db: string; head: number; at: number }
  | { type: "note"; text: string; at: number };

/** Distributes Omit over the union, so that `at` can be left to the writer. */
type WithoutAt<T> = T extends unknown ? Omit<T, "at"> : never;
export type HInput = WithoutAt<HRecord>;

/** Appends records to the history file; every `write` is one write(2) of one line. */
export class HistoryWriter {
  private fd: number | null;

  constructor(readonly file: string) {
    this.fd = openSync(file, "a");
  }

  write(record: HInput): void {
    if (this.fd === null) return;
    writeSync(this.fd, `${JSON.stringify({ ...record, at: Date.now() })}\n`);
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/** Parses a history file's text; a torn last line (a process killed mid-write) is ignored. */
export function parseHistory(text: string): HRecord[] {
  const out: HRecord[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    try {
      out.push(JSON.parse(line) as HRecord);
    } catch {
      // a torn line: the writer was killed inside write(2) (cannot be a complete record)
    }
  }
  return out;
}
