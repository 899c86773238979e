/**
 * The timeline page's HTTP handler, mounted on `cairn serve`'s port (next to /metrics) and served
 * alone by `cairn ui`. Read-only: every byte comes from a Reader, so serving the page never takes
 * ownership or disturbs the owner.
 *
 *   GET /                          the page (plain HTML, CSS and one small script from the package)
 *   GET /ui/app.css, /ui/app.js    its assets
 *   GET /api/databases             {"databases": [names]}
 *   GET /api/timeline?db=NAME      {"db", "head", "sessions": [SessionView]}
 *   GET /api/stream?db=NAME        server-sent events: one `snapshot` (the timeline), then an
 *                                  `update` (changed rounds and cells, new owners and marks) per commit
 *   GET /api/output?db&session&cell   a cell's recorded output (text/plain)
 *   GET /api/patch?db&session&round   a round's patch (JSON)
 *
 * Who may ask is decided before this handler sees a request, by the server's access gate
 * (../observability/access.ts: the Host check, then the token). The page is served under a strict
 * Content-Security-Policy and renders every recorded text with `textContent`.
 */
import { readFileSync, existsSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Logger } from "pino";
import type { Reader, Storage } from "../storage/contract.js";
import { readHistory } from "./source.js";
import { TimelineBuilder, type TimelineChanges } from "./timeline.js";

export interface TimelineHandlerOptions {
  readonly storage: Storage;
  /** The databases the page lists (`cairn serve`: the one it owns; `cairn ui`: the one named). */
  readonly databases: () => Promise<readonly string[]>;
  readonly logger?: Logger;
  /** How often a watched database is polled for new commits (default 250 ms). */
  readonly pollMs?: number;
}

export interface TimelineHandler {
  /** Serves the request when its path is the page's; resolves false (untouched) otherwise. */
  handle(req: IncomingMessage, res: ServerResponse): Promise<boolean>;
  /** Stops polling, ends streams, closes readers. Idempotent. */
  close(): Promise<void>;
}

const ASSETS: Record<string, { file: string; type: string }> = {
  "/": { file: "index.html", type: "text/html; charset=utf-8" },
  "/ui/app.css": { file: "app.css", type: "text/css; charset=utf-8" },
  "/ui/app.js": { file: "app.js", type: "text/javascript; charset=utf-8" },
};

/** The assets directory: next to this file from source, or under src/ui/assets from dist/. */
function assetsDir(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const candidate of [join(here, "assets"), join(here, "..", "..", "..", "src", "ui", "assets")]) {
    if (existsSync(join(candidate, "index.html"))) return candidate;
  }
  throw new Error(`the timeline page's files are missing (looked next to ${here}); reinstall cairn.`);
}

const HEARTBEAT_MS = 15_000;

interface Feed {
  readonly name: string;
  reader: Reader | null;
  readonly builder: TimelineBuilder;
  readonly subscribers: Set<ServerResponse>;
  timer: NodeJS.Timeout | null;
  /** The catch-up in flight, shared by everyone who asks meanwhile. */
  catching: Promise<void> | null;
  error: string | null;
}

function send(res: ServerResponse, status: number, body: string, type = "text/plain; charset=utf-8", extra: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": type, "cache-control": "no-store", "x-content-type-options": "nosniff", ...extra });
  res.end(body);
}

function sse(res: ServerResponse, event: string, data: unknown): void {
  res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

/** Builds the handler. Nothing is read until a request asks for a database. */
export function createTimelineHandler(opts: TimelineHandlerOptions): TimelineHandler {
  const pollMs = opts.pollMs ?? 250;
  const feeds = new Map<string, Feed>();
  const assets = assetsDir();
  const cache = new Map<string, string>();
  let closed = false;

  const asset = (file: string): string => {
    let text = cache.get(file);
    if (text === undefined) {
      text = readFileSync(join(assets, file), "utf8");
      cache.set(file, text);
    }
    return text;
  };

  const known = async (name: string | null): Promise<string | null> => {
    if (name === null || name === "") return null;
    return (await opts.databases()).includes(name) ? name : null;
  };

  const feedOf = (name: string): Feed => {
    let f = feeds.get(name);
    if (f === undefined) {
      f = { name, reader: null, builder: new TimelineBuilder(), subscribers: new Set(), timer: null, catching: null, error: null };
      feeds.set(name, f);
    }
    return f;
  };

  const broadcast = (f: Feed, changes: TimelineChanges): void => {
    if (changes.sessions.length === 0) return;
    for (const res of f.subscribers) sse(res, "update", changes);
  };

  /** Reads every commit after the feed's head; each page is applied and streamed at once. */
  const catchUp = (f: Feed): Promise<void> => {
    f.catching ??= (async () => {
      try {
        f.reader ??= await opts.storage.reader(f.name);
        await readHistory(f.reader, f.builder.head, (events) => {
          f.builder.apply(events);
          broadcast(f, f.builder.takeChanges());
        });
        if (f.error !== null) {
          f.error = null;
          for (const res of f.subscribers) sse(res, "status", { ok: true });
        }
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (f.error !== message) opts.logger?.warn({ err, db: f.name }, "timeline: reading the log failed; retrying");
        f.error = message;
        for (const res of f.subscribers) sse(res, "status", { ok: false, error: message });
        // A reader that failed may be unusable: open a fresh one next time.
        await f.reader?.close().catch(() => undefined);
        f.reader = null;
        throw err;
      } finally {
        f.catching = null;
      }
    })();
    return f.catching;
  };

  const schedule = (f: Feed): void => {
    if (f.timer !== null || closed || f.subscribers.size === 0) return;
    f.timer = setTimeout(() => {
      f.timer = null;
      catchUp(f)
        .catch(() => undefined)
        .finally(() => schedule(f));
    }, pollMs);
  };

  const snapshot = (f: Feed): unknown => ({ db: f.name, head: f.builder.head, sessions: f.builder.views() });

  const api = async (path: string, url: URL, req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (path === "/api/databases") return send(res, 200, JSON.stringify({ databases: await opts.databases() }), "application/json");
    const name = await known(url.searchParams.get("db"));
    if (name === null) return send(res, 404, JSON.stringify({ error: `no database ${JSON.stringify(url.searchParams.get("db") ?? "")} here; /api/databases lists them` }), "application/json");
    const f = feedOf(name);
    if (path === "/api/stream") {
      await catchUp(f);
      res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store", connection: "keep-alive", "x-accel-buffering": "no" });
      res.write("retry: 2000\n\n");
      sse(res, "snapshot", snapshot(f));
      f.subscribers.add(res);
      const beat = setInterval(() => res.write(": keep-alive\n\n"), HEARTBEAT_MS);
      req.on("close", () => {
        clearInterval(beat);
        f.subscribers.delete(res);
      });
      schedule(f);
      return;
    }
    await catchUp(f);
    if (path === "/api/timeline") return send(res, 200, JSON.stringify(snapshot(f)), "application/json");
    const session = url.searchParams.get("session") ?? "";
    if (f.builder.view(session) === undefined) return send(res, 404, JSON.stringify({ error: `no session ${JSON.stringify(session)} in ${name}` }), "application/json");
    if (path === "/api/output") {
      const cell = Number(url.searchParams.get("cell"));
      const out = f.builder.output(session, cell);
      if (out === undefined) return send(res, 404, `cell ${url.searchParams.get("cell")} of ${session} ran nothing\n`);
      const mark = out.dropped_bytes > 0 ? `\n[output truncated: ${out.dropped_bytes} bytes dropped]\n` : "";
      return send(res, 200, out.text + mark);
    }
    if (path === "/api/patch") {
      const patch = f.builder.patch(session, Number(url.searchParams.get("round")));
      if (patch === undefined) return send(res, 404, JSON.stringify({ error: `round ${url.searchParams.get("round")} of ${session} has no patch yet` }), "application/json");
      return send(res, 200, JSON.stringify(patch, null, 2), "application/json");
    }
    return send(res, 404, "not found\n");
  };

  return {
    async handle(req, res) {
      const url = new URL(req.url ?? "/", "http://localhost");
      const path = url.pathname;
      const page = ASSETS[path];
      if (page === undefined && !path.startsWith("/api/")) return false;
      if (req.method !== "GET" && req.method !== "HEAD") {
        send(res, 405, "method not allowed: the timeline is read-only\n", undefined, { allow: "GET, HEAD" });
        return true;
      }
      if (page !== undefined) {
        send(res, 200, asset(page.file), page.type, {
          "content-security-policy": "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
          "referrer-policy": "no-referrer",
          "x-frame-options": "DENY",
        });
        return true;
      }
      try {
        await api(path, url, req, res);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (!res.headersSent) send(res, 503, JSON.stringify({ error: `reading the log failed: ${message}` }), "application/json");
        else res.end();
      }
      return true;
    },
    async close() {
      if (closed) return;
      closed = true;
      for (const f of feeds.values()) {
        if (f.timer !== null) clearTimeout(f.timer);
        for (const res of f.subscribers) res.end();
        f.subscribers.clear();
        await f.catching?.catch(() => undefined);
        await f.reader?.close().catch(() => undefined);
      }
    },
  };
}
