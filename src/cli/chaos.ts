/**
 * Test-only fault injection for the `cairn` process: `CAIRN_CHAOS_KILL_AT=POINT[@N]` makes the
 * process SIGKILL itself the N-th time (default first) it reaches harness fault point POINT (see
 * HarnessFaultPoint). The chaos suite uses it to kill a real `cairn run` at exact commit boundaries.
 * Unset in production: no hook is installed.
 */
import type { HarnessFaults } from "../harness/core.js";
import { UsageError } from "./args.js";

const POINTS = ["patch:committed", "execution:started-committed", "execution:exited", "model:response-committed", "effect:begun-committed", "effect:ended-committed", "steer:committed", "approval:requested", "cancel:cells-stopped", "fork:batch-committed"];

export function chaosFaults(env: NodeJS.ProcessEnv): HarnessFaults | undefined {
  const spec = env.CAIRN_CHAOS_KILL_AT;
  if (spec === undefined || spec === "") return undefined;
  const [point, nth] = spec.split("@");
  if (point === undefined || !POINTS.includes(point)) throw new UsageError(`CAIRN_CHAOS_KILL_AT names no fault point: use one of ${POINTS.join(", ")}, optionally with @N.`);
  let remaining = nth === undefined ? 1 : Number(nth);
  if (!Number.isInteger(remaining) || remaining < 1) throw new UsageError(`CAIRN_CHAOS_KILL_AT: @N must be a positive whole number, got "${nth}".`);
  return (p) => {
    if (p !== point) return;
    remaining -= 1;
    if (remaining === 0) process.kill(process.pid, "SIGKILL");
  };
}
