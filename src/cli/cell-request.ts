/**
 * One request from inside a running cell to its harness over the cell socket (CAIRN_TIMER_SOCKET,
 * with the launch's CAIRN_CELL_TOKEN): one JSON line out, one JSON line back (src/harness/cell-socket.ts).
 */
import { connect } from "node:net";
import { UsageError } from "./args.js";
import type { Io } from "./main.js";

/** The harness's reply: `{ok: true, ...}` or `{ok: false, error, code?}`. */
export type CellAnswer = { ok: true; [key: string]: unknown } | { ok: false; error: string; code?: string };

/**
 * Sends `{token, op, ...fields}` and returns the reply. Throws a UsageError outside a cell (no
 * socket or token in the environment), or when the harness cannot be reached or answers nothing.
 */
export async function cellRequest(command: string, io: Io, op: string, fields: Record<string, unknown>): Promise<CellAnswer> {
  const socket = io.env.CAIRN_TIMER_SOCKET;
  const token = io.env.CAIRN_CELL_TOKEN;
  if (!socket || !token) throw new UsageError(`cairn ${command} runs inside a cell: CAIRN_TIMER_SOCKET and CAIRN_CELL_TOKEN are not set.`);
  const text = await new Promise<string>((resolve, reject) => {
    const c = connect(socket);
    let buf = "";
    c.setEncoding("utf8");
    c.on("connect", () => c.write(JSON.stringify({ ...fields, token, op }) + "\n"));
    c.on("data", (d: string) => (buf += d));
    c.on("end", () => resolve(buf));
    c.on("error", (e) => reject(new UsageError(`cairn ${command}: cannot reach the harness at ${socket}: ${e.message}`)));
  });
  try {
    return JSON.parse(text) as CellAnswer;
  } catch {
    throw new UsageError(`cairn ${command}: the harness closed the connection without an answer (it may be stopping).`);
  }
}
