/**
 * The timer socket: how a running cell registers a timer. The harness listens on a local Unix socket
 * and gives each cell its path in `CAIRN_TIMER_SOCKET` (with `CAIRN_SESSION` and `CAIRN_CELL`).
 *
 * Protocol: one JSON line per request, `{"session", "cell", "timer_id", "delay_seconds" | "due_at",
 * "note"?}`; one JSON line back, `{"ok": true, "timer_id", "due_at"}` once the registration is
 * committed, or `{"ok": false, "error"}`. `cairn timer` speaks it for shell users.
 */
import { randomUUID } from "node:crypto";
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { z } from "zod";

export const TimerRequest = z.strictObject({
  session: z.string().min(1),
  cell: z.number().int().positive().nullable().optional(),
  timer_id: z.string().min(1).max(200).regex(/^[A-Za-z0-9._:-]+$/, "timer_id may use letters, digits and . _ : -"),
  delay_seconds: z.number().nonnegative().max(10 * 365 * 86400).optional(),
  due_at: z.iso.datetime().optional(),
  note: z.string().max(2000).optional(),
});
export type TimerRequest = z.infer<typeof TimerRequest>;

export type TimerReply = { ok: true; timer_id: string; due_at: string } | { ok: false; error: string };

/** Starts the server; `register` commits and resolves with the reply. */
export async function startTimerServer(path: string, register: (req: TimerRequest) => Promise<TimerReply>): Promise<{ path: string; close(): Promise<void> }> {
  rmSync(path, { force: true });
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket: Socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    let buf = "";
    socket.setEncoding("utf8");
    socket.on("data", (d: string) => {
      buf += d;
      if (buf.length > 64 * 1024) {
        socket.end(JSON.stringify({ ok: false, error: "request too large" }) + "\n");
        return;
      }
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      const line = buf.slice(0, nl);
      buf = "";
      void handle(line).then((reply) => socket.end(JSON.stringify(reply) + "\n"));
    });
    socket.on("error", () => undefined);
  });
  async function handle(line: string): Promise<TimerReply> {
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      return { ok: false, error: "the request is not JSON; send one JSON object on one line" };
    }
    const parsed = TimerRequest.safeParse(raw);
    if (!parsed.success) return { ok: false, error: `bad timer request: ${parsed.error.issues.map((i) => `${i.path.join(".") || "request"}: ${i.message}`).join("; ")}` };
    if ((parsed.data.delay_seconds === undefined) === (parsed.data.due_at === undefined)) {
      return { ok: false, error: "give exactly one of delay_seconds or due_at" };
    }
    try {
      return await register(parsed.data);
    } catch (err) {
      return { ok: false, error: err instanceof Error ? err.message : String(err) };
    }
  }
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => resolve());
  });
  server.unref();
  return {
    path,
    close: () =>
      new Promise<void>((resolve) => {
        // A client that holds its connection open must not hold up shutdown.
        for (const socket of sockets) socket.destroy();
        server.close(() => {
          rmSync(path, { force: true });
          resolve();
        });
      }),
  };
}

/**
 * Where a harness's timer socket lives: `<workDir>/sockets/<db>-<pid>-<random>.sock`, or the OS temp dir
 * when that path is too long for a Unix socket. Sockets left by dead processes are removed.
 */
export function timerSocketPath(workDir: string, name: string): string {
  let dir = join(workDir, "sockets");
  const file = `${name}-${process.pid}-${randomUUID().slice(0, 6)}.sock`;
  if (join(dir, file).length > 100) dir = join(tmpdir(), "cairn-sockets");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (const f of readdirSync(dir)) {
    const m = /^(.+)-(\d+)-[0-9a-f]{6}\.sock$/.exec(f);
    if (m === null || m[1] !== name) continue;
    if (!pidAlive(Number(m[2]))) rmSync(join(dir, f), { force: true });
  }
  const path = join(dir, file);
  return path.length > 100 ? join(tmpdir(), `cairn-timer-${process.pid}-${randomUUID().slice(0, 8)}.sock`) : path;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
