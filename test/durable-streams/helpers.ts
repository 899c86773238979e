/**
 * Helpers of the Durable Streams tests: a reference server in a temporary directory (stopped, and the
 * directory removed, in an `after` hook whatever the test did), checks of a log, and the one way the
 * tests reproduce the state the reference server is left in when killed between its data fsync and its
 * producer-state update (`orphanFrame`).
 */
import assert from "node:assert/strict";
import { appendFileSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";
import type { LogEvent } from "../../src/state/events.js";
import { startDevServer, STREAM_PREFIX, type DevServer } from "../../storage-adapters/durable-streams/devserver.js";

/** A reference server in a temporary directory; stopped and removed after the file's tests. */
export async function devServer(prefix: string, options: { longPollMs?: number } = {}): Promise<DevServer & { root: string }> {
  const root = mkdtempSync(join(tmpdir(), `cairn-ds-${prefix}-`));
  const server = await startDevServer({ dir: join(root, "server"), ...options });
  after(async () => {
    await server.stop();
    rmSync(root, { recursive: true, force: true });
  });
  return Object.assign(server, { root });
}

/**
 * Appends `record` to the segment file of stream `path` (relative to the base URL, e.g. "db/log") as
 * the reference server frames it (4-byte big-endian length, the message as it stores a JSON one, a
 * newline), with the server stopped: exactly what a server SIGKILLed after fsyncing an append and
 * before recording it in its metadata (producer state and offset) leaves behind. Its recovery then
 * takes the file's length as the truth and keeps the old producer state (file-store.ts, recover()).
 */
export function orphanFrame(server: DevServer, path: string, record: unknown): void {
  const data = Buffer.from(`${JSON.stringify(record)},`, "utf8");
  const length = Buffer.alloc(4);
  length.writeUInt32BE(data.length, 0);
  appendFileSync(segmentFile(server, path), Buffer.concat([length, data, Buffer.from("\n")]));
}

/**
 * Appends the first `keep` bytes of the frame of `record` to stream `path`'s segment file, with the
 * server stopped: a write cut short by the server's death (a SIGKILL during a large write returns a
 * short write). The server's recovery skips a torn frame when it computes the offset but leaves its
 * bytes in the file.
 */
export function tornFrame(server: DevServer, path: string, record: unknown, keep: number): void {
  const data = Buffer.from(`${JSON.stringify(record)},`, "utf8");
  const length = Buffer.alloc(4);
  length.writeUInt32BE(data.length, 0);
  appendFileSync(segmentFile(server, path), Buffer.concat([length, data, Buffer.from("\n")]).subarray(0, keep));
}

/** The reference server's segment file of stream `path` (relative to the base URL). */
function segmentFile(server: DevServer, path: string): string {
  const encoded = Buffer.from(`${STREAM_PREFIX}/${path}`, "utf8").toString("base64").replace(/\+/g, "-").replace(/\//g, "_").replace(/=/g, "");
  const dir = join(server.dir, "streams");
  const files = readdirSync(dir).filter((f) => f.startsWith(`${encoded}~`) && f.endsWith(".log"));
  assert.equal(files.length, 1, `one segment file for ${path} in ${dir}: ${files.join(", ")}`);
  return join(dir, files[0]!);
}

/** How many times the server's recovery found a stream file longer than its metadata (the crash window hit). */
export function reconciled(server: DevServer): number {
  return (readFileSync(server.logFile, "utf8").match(/Offset mismatch/g) ?? []).length;
}

/** Asserts that `log` is seqs 1..n with unique identities. */
export function assertWellFormed(log: readonly LogEvent[], what: string): void {
  assert.deepEqual(
    log.map((e) => e.seq),
    Array.from({ length: log.length }, (_, i) => i + 1),
    `${what}: seqs are 1..${log.length} without a gap`,
  );
  const ids = new Set(log.map((e) => e.identity));
  assert.equal(ids.size, log.length, `${what}: every identity is unique`);
}

/** Asserts that every receipted batch is in `log` at its seqs, with its identities. */
export function assertReceipted(log: readonly LogEvent[], receipts: readonly { firstSeq: number; lastSeq: number; identities: readonly string[] }[], what: string): void {
  for (const r of receipts) {
    const got = log.filter((e) => e.seq >= r.firstSeq && e.seq <= r.lastSeq).map((e) => e.identity);
    assert.deepEqual(got, r.identities, `${what}: receipted batch ${r.firstSeq}..${r.lastSeq} is in the log`);
  }
}

/** Runs `body`; a failure carries the end of the server's log (what the server said when it went wrong). */
export async function withServerLog<T>(server: DevServer, body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (err) {
    if (err instanceof Error) err.message += `\n--- the end of the server's log (${server.logFile}):\n${readFileSync(server.logFile, "utf8").slice(-3000)}`;
    throw err;
  }
}

/** A request as a proxy rule sees it. */
export interface ProxiedRequest {
  readonly method: string;
  readonly path: string;
  readonly headers: Record<string, string>;
  readonly body: string;
}

/** An HTTP proxy in front of a server that can lose answers: the network between the adapter and the server, misbehaving on purpose. */
export interface LossyProxy {
  /** The base URL to give the adapter (same path as the server's). */
  readonly url: string;
  /**
   * Loses the answer to the next request matching `match`: with `before`, the request is never
   * forwarded (lost on the way); otherwise it is forwarded, the server applies it, and its answer is
   * lost. `hook` runs in between (before the connection is cut). Resolves once that happened.
   */
  lose(match: (req: ProxiedRequest) => boolean, options?: { before?: boolean; hook?: () => Promise<void> }): Promise<void>;
  close(): Promise<void>;
}

const HOP = new Set(["content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive", "host"]);

/** Starts a lossy proxy to `server` (closed after the file's tests). */
export async function lossyProxy(server: DevServer): Promise<LossyProxy> {
  const { createServer } = await import("node:http");
  const upstream = new URL(server.url).origin;
  const rules: { match: (req: ProxiedRequest) => boolean; before: boolean; hook: (() => Promise<void>) | undefined; done: () => void }[] = [];
  const proxy = createServer((req, res) => {
    void (async () => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && typeof v === "string") headers[k] = v;
      const seen: ProxiedRequest = { method: req.method ?? "GET", path: req.url ?? "/", headers, body: Buffer.concat(chunks).toString("utf8") };
      const i = rules.findIndex((r) => r.match(seen));
      const rule = i >= 0 ? rules.splice(i, 1)[0] : undefined;
      if (rule?.before === true) {
        await rule.hook?.();
        req.socket.destroy();
        rule.done();
        return;
      }
      const up = await fetch(`${upstream}${seen.path}`, { method: seen.method, headers, ...(seen.method === "GET" || seen.method === "HEAD" ? {} : { body: Buffer.concat(chunks) }) });
      const body = Buffer.from(await up.arrayBuffer());
      if (rule !== undefined) {
        await rule.hook?.();
        req.socket.destroy();
        rule.done();
        return;
      }
      const out: Record<string, string> = {};
      up.headers.forEach((v, k) => {
        if (!HOP.has(k)) out[k] = v;
      });
      res.writeHead(up.status, out);
      res.end(body);
    })().catch(() => req.socket.destroy());
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", () => r()));
  const port = (proxy.address() as { port: number }).port;
  const close = async () => {
    proxy.closeAllConnections();
    await new Promise<void>((r) => proxy.close(() => r()));
  };
  after(close);
  return {
    url: `http://127.0.0.1:${port}${new URL(server.url).pathname}`,
    lose: (match, options = {}) => new Promise<void>((done) => rules.push({ match, before: options.before === true, hook: options.hook, done })),
    close,
  };
}
