/**
 * The cell socket: how a running cell talks to its harness (`cairn timer`, and whatever else a cell
 * may ask). The harness listens on a Unix socket in its private runtime dir; a sandboxed cell sees
 * it bound at /run/cairn/cairn.sock, and finds it in `CAIRN_TIMER_SOCKET` either way.
 *
 * Who is asking is never taken from the request: each launch gets a random token
 * (`CAIRN_CELL_TOKEN`), and the harness answers only requests that carry a token it issued, as the
 * session and cell it was issued for. A cell cannot act for another run by naming it.
 *
 * Protocol: one JSON line per request, `{"token", "op"?, ...}`; one JSON line back, `{"ok": true, ...}`
 * or `{"ok": false, "error", "code"?}`. `op` defaults to "timer" (see timers.ts for its fields); the
 * effect ledger's are "effect_begin", "effect_end" and "effect_key" (effects.ts).
 */
import { randomBytes } from "node:crypto";
import { rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";

/** The run and cell a token was issued to. */
export interface CellCaller {
  readonly session: string;
  readonly cell: number;
}

/** A reply; a refusal may carry a stable `code` (`usage`, `reset` when fenced, `uncertain`, ...). */
export type CellReply = { ok: true; [key: string]: unknown } | { ok: false; error: string; code?: string };

/** Answers one request (its `op` and fields) from `caller`. */
export type CellHandler = (op: string, request: Record<string, unknown>, caller: CellCaller) => Promise<CellReply>;

/** A request line may not exceed this. */
const MAX_REQUEST = 64 * 1024;
/** Connections held at once; more are closed at once. */
const MAX_CONNECTIONS = 256;

/** The harness's cell socket: tokens it issued, and the server. */
export class CellSocket {
  private readonly tokens = new Map<string, CellCaller>();
  private server: Server | null = null;
  private readonly sockets = new Set<Socket>();

  constructor(private readonly handle: CellHandler) {}

  /** A new token for a launch of `cell` in `session`; valid until revoked. */
  issue(session: string, cell: number): string {
    const token = randomBytes(16).toString("hex");
    this.tokens.set(token, { session, cell });
    return token;
  }

  /** The launch ended: its token opens nothing any more. */
  revoke(token: string): void {
    this.tokens.delete(token);
  }

  /** Starts listening at `path` (a fresh path in the harness's private dir). */
  async listen(path: string): Promise<void> {
    const server = createServer((socket) => this.accept(socket));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(path, () => {
        server.off("error", reject);
        resolve();
      });
    });
    server.on("error", () => undefined);
    server.unref();
    this.server = server;
  }

  private accept(socket: Socket): void {
    socket.on("error", () => undefined);
    if (this.sockets.size >= MAX_CONNECTIONS) {
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    socket.on("close", () => this.sockets.delete(socket));
    let buf = "";
    socket.setEncoding("utf8");
    const onData = (d: string): void => {
      buf += d;
      const nl = buf.indexOf("\n");
      if (nl < 0) {
        if (buf.length > MAX_REQUEST) {
          socket.off("data", onData);
          socket.end(JSON.stringify({ ok: false, error: "request too large" }) + "\n");
        }
        return;
      }
      socket.off("data", onData);
      void this.answer(buf.slice(0, nl)).then((reply) => socket.end(JSON.stringify(reply) + "\n"));
    };
    socket.on("data", onData);
  }

  private async answer(line: string): Promise<CellReply> {
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      return { ok: false, error: "the request is not JSON; send one JSON object on one line" };
    }
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return { ok: false, error: "the request must be a JSON object" };
    const req = raw as Record<string, unknown>;
    const caller = typeof req.token === "string" ? this.tokens.get(req.token) : undefined;
    if (caller === undefined) {
      return { ok: false, error: "the request carries no valid cell token (CAIRN_CELL_TOKEN): only a running cell of this harness can ask, and only for itself" };
    }
    const { token: _token, op, ...rest } = req;
    try {
      return await this.handle(typeof op === "string" ? op : "timer", rest, caller);
    } catch (err) {
      return { ok: false, error: err instanceof Error ? err.message : String(err) };
    }
  }

  /** Stops listening; open connections are closed (a client holding one must not hold up shutdown). */
  async close(): Promise<void> {
    const server = this.server;
    this.server = null;
    this.tokens.clear();
    for (const socket of this.sockets) socket.destroy();
    if (server === null) return;
    const path = server.address();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    if (typeof path === "string") rmSync(path, { force: true });
  }
}
