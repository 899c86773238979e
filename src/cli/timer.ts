/**
 * `cairn timer`: registers a timer from inside a running cell, through the harness's timer socket
 * (CAIRN_TIMER_SOCKET). It returns once the registration is committed.
 */
import { durationSeconds, parse, required, str, UsageError } from "./args.js";
import { cellRequest } from "./cell-request.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";

const HELP = `usage: cairn timer --id ID (--in DURATION | --at ISO-TIME) [--note TEXT]

Inside a running cell: asks the harness to wake the model when the timer is due. The registration
is committed before this command returns; after a restart the timer fires exactly once, late rather
than never. Reads CAIRN_TIMER_SOCKET and CAIRN_CELL_TOKEN, which the harness sets for each cell.`;

export async function timerCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("timer", argv, { id: { type: "string" }, in: { type: "string" }, at: { type: "string" }, note: { type: "string" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  const id = required(p, "timer", "id", "a name for this timer, unique in the run");
  const inStr = str(p, "in");
  const at = str(p, "at");
  if ((inStr === undefined) === (at === undefined)) throw new UsageError("cairn timer: give exactly one of --in DURATION or --at ISO-TIME.");
  const req: Record<string, unknown> = { timer_id: id };
  if (inStr !== undefined) req.delay_seconds = durationSeconds("timer", "in", inStr);
  if (at !== undefined) req.due_at = at;
  const note = str(p, "note");
  if (note !== undefined) req.note = note;
  const r = await cellRequest("timer", io, "timer", req);
  if (!r.ok) {
    io.err(`cairn: timer refused: ${r.error}`);
    return EXIT.usage;
  }
  io.out(`timer ${id} due ${r.due_at}`);
  return EXIT.ok;
}
