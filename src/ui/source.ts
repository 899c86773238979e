/**
 * Where `cairn log` and the timeline page read history from: a Reader, never an owner, so reading
 * never disturbs the process that runs the database.
 *
 * This is the one seam for history that is not in the live log. When snapshots shorten the log,
 * events older than the snapshot come from the local copy or the archive: `readHistory` is where
 * that source is consulted first, before the reader's pages. Everything above it sees one ordered
 * stream of events.
 */
import type { LogEvent } from "../state/events.js";
import { parseLogEvent } from "../state/events.js";
import type { Reader } from "../storage/contract.js";

/** Events per read: bounded pages keep memory flat on long logs. */
export const PAGE = 2000;

/**
 * Calls `onBatch` with every committed event after `afterSeq`, page by page, in order, each validated
 * (the log is read from disk and the network, not trusted). Resolves with the last seq delivered.
 * `raw` is what the storage returned, for output that must round-trip exactly.
 */
export async function readHistory(reader: Reader, afterSeq: number, onBatch: (events: readonly LogEvent[], raw: readonly LogEvent[]) => void): Promise<number> {
  let head = afterSeq;
  for (;;) {
    const raw = await reader.read(head, PAGE);
    if (raw.length === 0) return head;
    const parsed = raw.map((e) => parseLogEvent(e));
    head = raw[raw.length - 1]!.seq;
    onBatch(parsed, raw);
    if (raw.length < PAGE) return head;
  }
}

/**
 * Polls `reader` for events after `afterSeq` every `intervalMs` until `signal` aborts, delivering
 * each new batch as it commits. Storage errors end the loop with a throw (never a silent stop).
 */
export async function followHistory(
  reader: Reader,
  afterSeq: number,
  intervalMs: number,
  signal: AbortSignal,
  onBatch: (events: readonly LogEvent[], raw: readonly LogEvent[]) => void,
): Promise<number> {
  let head = afterSeq;
  while (!signal.aborted) {
    head = await readHistory(reader, head, onBatch);
    if (signal.aborted) break;
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, intervalMs);
      function done(): void {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        resolve();
      }
      signal.addEventListener("abort", done, { once: true });
    });
  }
  return head;
}
