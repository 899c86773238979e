/**
 * Output capture for one execution: stdout and stderr decoded as UTF-8 separately (a character split
 * across reads is held back until it is whole), batched, handed to the caller at most once per flush
 * interval (never two calls at once), and bounded in total bytes, with truncation always marked.
 */
import { StringDecoder } from "node:string_decoder";

/** One piece of captured output, in order. Consecutive pieces of the same stream are merged. */
export interface OutputChunk {
  readonly stream: "stdout" | "stderr";
  readonly data: string;
}

/** Options of {@link OutputCapture}. */
export interface OutputCaptureOptions {
  /** Total bytes kept across both streams; bytes past it are dropped and counted. */
  readonly limitBytes: number;
  /** Minimum time between the starts of two `onOutput` calls, in ms. */
  readonly flushIntervalMs: number;
  /** Receives batches; awaited, never called concurrently. A rejection stops further delivery. */
  readonly onOutput: (chunks: OutputChunk[]) => Promise<void>;
  /** Monotonic clock in ms for the throttle. Default `performance.now`. */
  readonly clock?: () => number;
}

/** The marker appended (on stderr) when output was truncated. */
export function truncationMarker(keptBytes: number, droppedBytes: number): string {
  return `[cairn: output truncated after ${keptBytes} bytes; ${droppedBytes} bytes dropped]\n`;
}

/**
 * The largest cut <= n that does not split a UTF-8 sequence inside `buf` (continuation bytes are
 * 10xxxxxx; a cut is moved back to the lead byte of the character it would split, at most 3 bytes).
 */
export function utf8CutPoint(buf: Uint8Array, n: number): number {
  if (n >= buf.length) return buf.length;
  if (n <= 0) return 0;
  let i = n;
  while (i > 0 && n - i < 3 && ((buf[i] ?? 0) & 0xc0) === 0x80) i--;
  return ((buf[i] ?? 0) & 0xc0) === 0x80 ? n : i;
}

/**
 * Collects one execution's output. Call `start()` when the process is released, `push()` for every
 * read, and `finish()` once both streams have ended; `finish()` delivers the rest and the truncation
 * marker, and rejects with the first error `onOutput` threw (after which nothing more is delivered).
 */
export class OutputCapture {
  private readonly options: OutputCaptureOptions;
  private readonly clock: () => number;
  private readonly decoders = { stdout: new StringDecoder("utf8"), stderr: new StringDecoder("utf8") };
  private pending: { stream: "stdout" | "stderr"; data: string }[] = [];
  private kept = 0;
  private dropped = 0;
  private lastFlushAt = Number.NEGATIVE_INFINITY;
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private failure: { error: unknown } | null = null;
  private lastChar = "\n";
  private finished = false;

  constructor(options: OutputCaptureOptions) {
    if (!Number.isInteger(options.limitBytes) || options.limitBytes < 0) throw new RangeError("limitBytes must be an integer >= 0");
    if (!(options.flushIntervalMs >= 0)) throw new RangeError("flushIntervalMs must be >= 0");
    this.options = options;
    this.clock = options.clock ?? (() => performance.now());
  }

  /** Bytes kept (delivered or about to be). */
  get outputBytes(): number {
    return this.kept;
  }

  /** Bytes dropped past the limit. */
  get droppedBytes(): number {
    return this.dropped;
  }

  /** Starts the throttle window: the first batch goes out one interval after this. */
  start(): void {
    this.lastFlushAt = this.clock();
  }

  /** Takes one read from a stream. Past the limit, bytes are only counted. */
  push(stream: "stdout" | "stderr", buf: Uint8Array): void {
    if (buf.length === 0 || this.finished) return;
    if (this.dropped > 0) {
      this.dropped += buf.length;
      return;
    }
    const room = this.options.limitBytes - this.kept;
    let keep = buf;
    if (buf.length > room) {
      const cut = utf8CutPoint(buf, room);
      keep = buf.subarray(0, cut);
      this.dropped += buf.length - cut;
    }
    this.kept += keep.length;
    if (keep.length > 0) this.append(stream, this.decoders[stream].write(Buffer.from(keep.buffer, keep.byteOffset, keep.length)));
    this.schedule();
  }

  /** Delivers everything left, then the truncation marker if anything was dropped. Idempotent. */
  async finish(): Promise<void> {
    if (!this.finished) {
      this.finished = true;
      if (this.timer !== null) clearTimeout(this.timer);
      this.timer = null;
      this.append("stdout", this.decoders.stdout.end());
      this.append("stderr", this.decoders.stderr.end());
      if (this.dropped > 0) {
        this.append("stderr", (this.lastChar === "\n" ? "" : "\n") + truncationMarker(this.kept, this.dropped));
      }
      while (this.flushing !== null) await this.flushing;
      await this.flushNow();
    }
    while (this.flushing !== null) await this.flushing;
    if (this.failure !== null) throw this.failure.error;
  }

  private append(stream: "stdout" | "stderr", data: string): void {
    if (data === "") return;
    this.lastChar = data.slice(-1);
    const last = this.pending[this.pending.length - 1];
    if (last !== undefined && last.stream === stream) last.data += data;
    else this.pending.push({ stream, data });
  }

  private schedule(): void {
    if (this.timer !== null || this.flushing !== null || this.finished || this.pending.length === 0) return;
    const wait = Math.max(0, this.lastFlushAt + this.options.flushIntervalMs - this.clock());
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.flushNow();
    }, wait);
  }

  private flushNow(): Promise<void> {
    if (this.pending.length === 0 || this.failure !== null) {
      this.pending = [];
      return Promise.resolve();
    }
    const batch: OutputChunk[] = this.pending.map((c) => ({ stream: c.stream, data: c.data }));
    this.pending = [];
    this.lastFlushAt = this.clock();
    const run = (async () => {
      try {
        await this.options.onOutput(batch);
      } catch (error) {
        this.failure ??= { error };
      }
    })();
    this.flushing = run.finally(() => {
      this.flushing = null;
      this.schedule();
    });
    return this.flushing;
  }
}
