/**
 * Stopping a whole process group: SIGTERM, a grace period, then SIGKILL, and confirmation from /proc
 * that no live member remains.
 */
import { liveGroupMembers } from "./procfs.js";

/** What happened when a process group was stopped. */
export interface GroupStopResult {
  /** True when /proc shows no live process left in the group. */
  readonly empty: boolean;
  /** Which signals were sent, in order (empty when the group had no live member to begin with). */
  readonly signals: readonly ("SIGTERM" | "SIGKILL")[];
  /** True when the kernel refused to signal the group (EPERM: another user's processes). */
  readonly permissionDenied: boolean;
  /** The live members left when `empty` is false. */
  readonly remaining: readonly number[];
}

/** Options of {@link terminateGroup}. */
export interface TerminateGroupOptions {
  /** How long members get to exit after SIGTERM before SIGKILL. Default 2000 ms; 0 sends SIGKILL at once. */
  readonly graceMs?: number;
  /** How long to wait for the group to empty after SIGKILL. Default 5000 ms. */
  readonly settleMs?: number;
  /** How often /proc is scanned while waiting. Default 20 ms. */
  readonly pollMs?: number;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Sends `signal` to every process of group `pgid`. Returns "ok", "gone" (ESRCH) or "denied" (EPERM). */
export function signalGroup(pgid: number, signal: NodeJS.Signals): "ok" | "gone" | "denied" {
  if (!Number.isInteger(pgid) || pgid <= 1) throw new RangeError(`refusing to signal process group ${pgid}`);
  try {
    process.kill(-pgid, signal);
    return "ok";
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ESRCH") return "gone";
    if (code === "EPERM") return "denied";
    throw err;
  }
}

async function waitEmpty(pgid: number, ms: number, pollMs: number): Promise<number[]> {
  const deadline = Date.now() + ms;
  let members = liveGroupMembers(pgid);
  while (members.length > 0 && Date.now() < deadline) {
    await sleep(Math.min(pollMs, Math.max(1, deadline - Date.now())));
    members = liveGroupMembers(pgid);
  }
  return members;
}

/**
 * Stops every process of group `pgid`: SIGTERM (plus SIGCONT, so stopped members can act on it),
 * waits up to `graceMs` for the group to empty, then SIGKILL and waits up to `settleMs`.
 * Signals nothing when the group has no live member. Never throws for a group that vanished or
 * that belongs to another user (`permissionDenied`); the caller reads `empty` to know the truth.
 */
export async function terminateGroup(pgid: number, options: TerminateGroupOptions = {}): Promise<GroupStopResult> {
  const graceMs = options.graceMs ?? 2000;
  const settleMs = options.settleMs ?? 5000;
  const pollMs = options.pollMs ?? 20;
  const signals: ("SIGTERM" | "SIGKILL")[] = [];
  let members = liveGroupMembers(pgid);
  if (members.length === 0) return { empty: true, signals, permissionDenied: false, remaining: [] };

  if (graceMs > 0) {
    const sent = signalGroup(pgid, "SIGTERM");
    if (sent === "denied") return { empty: false, signals, permissionDenied: true, remaining: members };
    signals.push("SIGTERM");
    if (sent === "ok") signalGroup(pgid, "SIGCONT");
    members = await waitEmpty(pgid, graceMs, pollMs);
    if (members.length === 0) return { empty: true, signals, permissionDenied: false, remaining: [] };
  }

  const killed = signalGroup(pgid, "SIGKILL");
  if (killed === "denied") return { empty: false, signals, permissionDenied: true, remaining: members };
  signals.push("SIGKILL");
  members = await waitEmpty(pgid, settleMs, pollMs);
  return { empty: members.length === 0, signals, permissionDenied: false, remaining: members };
}
