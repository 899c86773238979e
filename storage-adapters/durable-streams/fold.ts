/**
 * The log fold: which records of a database's log stream count, decided from the records alone, in
 * stream order, the same way by every reader. Pure: no I/O.
 *
 * The rule is the server's own producer check, replayed. A Durable Streams server keeps, per producer,
 * an (epoch, last seq) state and appends a record only when it is the next one: seq 0 of a higher
 * epoch (a claim), or last seq + 1 of the same epoch. So in a log written through one producer id,
 * every record is acceptable after the one before it, and the fold checks exactly that.
 *
 * What a server may do that breaks the chain, and how the fold reads it. The protocol asks a server
 * to commit producer state together with the data, but lets one that does not say so (PROTOCOL.md,
 * "Atomicity Requirements"). The reference server is one: it fsyncs the record, then updates the
 * producer state in a second store, then answers. Killed between the two, it comes back with the
 * record in the stream and the state from before it: an "orphan" that nobody was told was appended.
 * The next record the server accepts is then acceptable after the state BEFORE the orphan, not after
 * it. The fold recognizes that and voids ("pops") the orphan, but only where voiding it cannot undo
 * anything anyone was told:
 *  - a record without events (a claim, an opened mark) is voided when what follows proves the server
 *    had forgotten it: its claimant was never told its open succeeded (the opened mark proves a claim;
 *    see below), so nothing it did counts;
 *  - a commit is "voided" only by an identical copy right after it (its writer's retry of the same
 *    producer seq, which the server accepted again): the events stay, at the same seqs;
 *  - a record that a later record of its epoch was accepted after ("proven": the server held it when
 *    it accepted that one) is never voided.
 * Anything else (for example a record of an older epoch after a proven newer one: the server forgot
 * producer state it had acknowledged) is not guessed at: the fold throws `LogDiverged`, every reader
 * refuses the log, and the error says why.
 *
 * An owner appends an `opened` mark (E, 1) right after its claim (E, 0), so a completed open is
 * proven, and the frames a fold must keep (those a later record could still void, plus the proven one
 * under them) stay few: a snapshot's cut stores them, and a fold started there decides exactly as
 * one started at the beginning.
 */
import type { LogRecord } from "./records.js";

/** A record the fold kept, as far as later records can still concern it. */
export interface Frame {
  readonly t: "claim" | "opened" | "commit";
  readonly e: number;
  readonly s: number;
  /** A later record of the same epoch was accepted after it: never voided. */
  proven: boolean;
  /** Claims: the claimant's nonce. */
  readonly n?: string;
  /** Commits: first seq, number of events, digest of the events. */
  readonly f?: number;
  readonly c?: number;
  readonly h?: string;
}

/** The fold's state at an offset: serializable (a snapshot's cut stores it). */
export interface FoldState {
  /** The highest event seq counted. */
  head: number;
  /** The highest epoch in any record seen (counted or not). */
  maxEpoch: number;
  /** The last proven frame and every frame after it (those a later record may still void). */
  frames: Frame[];
}

/** The log broke the producer chain in a way that voiding unacknowledged records cannot explain. */
export class LogDiverged extends Error {
  constructor(message: string) {
    super(message);
    this.name = "LogDiverged";
  }
}

/** What applying one record did. */
export interface Applied {
  /** The record's frame, now the top. */
  readonly frame: Frame;
  /** Frames voided to accept it, newest first. */
  readonly popped: readonly Frame[];
}

/** The state of an empty log. */
export function emptyState(): FoldState {
  return { head: 0, maxEpoch: 0, frames: [] };
}

/** A deep copy of `state`. */
export function cloneState(state: FoldState): FoldState {
  return { head: state.head, maxEpoch: state.maxEpoch, frames: state.frames.map((f) => ({ ...f })) };
}

function frameOf(r: LogRecord): Frame {
  if (r.t === "claim") return { t: "claim", e: r.e, s: 0, proven: false, n: r.n };
  if (r.t === "opened") return { t: "opened", e: r.e, s: 1, proven: false };
  return { t: "commit", e: r.e, s: r.s, proven: false, f: r.f, c: r.c, h: r.h };
}

/** Whether the server could have accepted `r` with its producer state at `top` (the last record kept). */
function acceptable(r: LogRecord, top: Frame | undefined): boolean {
  if (top === undefined) return r.t === "claim";
  if (r.e > top.e) return r.t === "claim";
  return r.e === top.e && r.s === top.s + 1;
}

function sameCommit(top: Frame, r: LogRecord): boolean {
  return r.t === "commit" && top.t === "commit" && r.e === top.e && r.s === top.s && r.f === top.f && r.c === top.c && r.h === top.h;
}

function describe(r: LogRecord | Frame): string {
  return `${r.t} (epoch ${r.e}, producer seq ${r.s})`;
}

/**
 * Applies record `r` to `state` (mutated). Returns its frame and the frames voided for it; throws
 * LogDiverged when the record cannot follow the log under the rule above.
 */
export function applyRecord(state: FoldState, r: LogRecord): Applied {
  // Worked on copies and committed only on success: a refused record leaves `state` as it was.
  const frames = state.frames.slice();
  let head = state.head;
  const popped: Frame[] = [];
  for (;;) {
    const top = frames.at(-1);
    if (acceptable(r, top)) {
      if (r.t === "commit" && r.f !== head + 1) {
        throw new LogDiverged(`the log's ${describe(r)} says its events start at seq ${r.f}, but the log before it ends at seq ${head}`);
      }
      const frame = frameOf(r);
      if (top !== undefined && top.e === r.e) {
        top.proven = true;
        // Nothing under a proven frame can be voided any more: keep it and what follows.
        state.frames = [top, frame];
      } else {
        frames.push(frame);
        state.frames = frames;
      }
      state.head = r.t === "commit" ? head + r.c : head;
      if (r.e > state.maxEpoch) state.maxEpoch = r.e;
      return { frame, popped };
    }
    if (top === undefined || top.proven || (top.t === "commit" && !sameCommit(top, r))) {
      const after = top === undefined ? "the beginning of the log" : `${describe(top)}${top.proven ? ", which a later record of its epoch proves the server held" : ""}`;
      throw new LogDiverged(
        `the log holds a ${describe(r)} right after ${after}: a Durable Streams server accepts that only after losing producer state it had acknowledged (for example a server without atomic producer state that lost power). Refusing to guess which records count.`,
      );
    }
    frames.pop();
    if (top.t === "commit") head -= top.c!;
    popped.push(top);
  }
}

/** The claim frame of epoch `e` among the kept frames, or undefined. */
export function claimFrame(state: FoldState, e: number): Frame | undefined {
  return state.frames.find((f) => f.t === "claim" && f.e === e);
}

/**
 * The epoch of the newest record kept (0 for an empty log). Epochs never go down along the kept
 * records, so an owner of epoch E is superseded exactly when this is above E.
 */
export function topEpoch(state: FoldState): number {
  return state.frames.at(-1)?.e ?? 0;
}
