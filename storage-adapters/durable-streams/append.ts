/**
 * Appending an owner's record to the log with the producer headers, through lost answers.
 *
 * An append whose answer was lost may or may not be in the stream. It is sent again, unchanged (same
 * epoch, same producer seq, same bytes), until the server gives a definite answer: 200 (appended now;
 * if the first one had landed but the server had forgotten it, the fold voids that copy: fold.ts),
 * 204 (the first one landed), or a refusal. The caller then reads the stream back to learn where its
 * record is, or whether it is there at all; nothing is decided by guessing.
 */
import { DsTransportError, type AppendResult, type Wire } from "./http.js";
import { sleep } from "./mailbox.js";

/** The definite answer, and whether an earlier attempt's answer was lost (so the record may be in the stream). */
export interface Resolved {
  readonly result: AppendResult;
  readonly ambiguous: boolean;
}

/**
 * Sends `body` to `path` as producer (id, epoch, seq) until a definite answer; a 429 is waited out
 * like a lost answer. Gives up after `outageMs` by throwing the last DsTransportError (the record may
 * or may not be in the stream) with `ambiguous` set on it.
 */
export async function appendResolving(wire: Wire, path: string, body: string, producer: { id: string; epoch: number; seq: number }, outageMs: number, signal?: AbortSignal): Promise<Resolved> {
  const deadline = Date.now() + outageMs;
  let ambiguous = false;
  for (let attempt = 0; ; attempt++) {
    try {
      const result = await wire.append(path, body, producer, signal);
      if (result.kind !== "rate-limited") return { result, ambiguous };
      if (Date.now() > deadline) return { result, ambiguous };
    } catch (err) {
      if (!(err instanceof DsTransportError)) throw err;
      ambiguous = true;
      if (Date.now() > deadline || signal?.aborted === true) throw Object.assign(err, { ambiguous: true });
    }
    await sleep(Math.min(1000, 25 * 2 ** attempt));
  }
}
