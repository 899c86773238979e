/**
 * Process identity: who ran a cell (host, boot, pid, process group, start time), and what to do about
 * a process recorded by an earlier run of Cairn that may still be alive (a "survivor").
 *
 * A pid alone names nothing durable: the kernel reuses pids. The identity of a process is the pid
 * together with its start time (field 22 of /proc/PID/stat) on one boot of one host.
 */
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import type { ProcessIdentity } from "../state/projection.js";
import { terminateGroup } from "./group.js";
import { isDead, liveGroupMembers, readProcStat } from "./procfs.js";

export type { ProcessIdentity };

/** This machine's host name (`os.hostname()`). */
export function hostName(): string {
  return hostname();
}

let thisBoot: string | undefined;

/**
 * This boot's id (/proc/sys/kernel/random/boot_id, trimmed): it changes on every restart of the
 * machine. Throws when /proc cannot be read (Cairn's process identity needs Linux). Read once: a
 * process never outlives its boot, so the id cannot change while this process runs (one file read
 * fewer per launch).
 */
export function bootId(): string {
  thisBoot ??= readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  return thisBoot;
}

/** The start time of `pid` (field 22 of /proc/PID/stat, clock ticks after boot), or null when no such process. */
export function processStartTime(pid: number): string | null {
  return readProcStat(pid)?.startTime ?? null;
}

/** The process group of `pid`, or null when no such process. */
export function processGroupOf(pid: number): number | null {
  return readProcStat(pid)?.pgid ?? null;
}

/** The full identity of a live process on this machine, or null when there is no such process. */
export function identityOf(pid: number): ProcessIdentity | null {
  const stat = readProcStat(pid);
  if (stat === null) return null;
  return { host: hostName(), boot_id: bootId(), pid, pgid: stat.pgid, start_time: stat.startTime };
}

/** What {@link describeSurvivor} found. */
export interface SurvivorDescription {
  /**
   * `same_process`: host, boot, pid and start time all match and it has not exited.
   * `gone`: the pid has exited (or is a zombie). `recycled`: the pid is alive but is another process
   * (other start time). `other_host` / `other_boot`: it cannot be checked from here.
   */
  readonly state: "same_process" | "gone" | "recycled" | "other_host" | "other_boot";
  /** Live pids in the recorded process group (empty for other_host / other_boot). */
  readonly members: number[];
}

/**
 * Classifies a recorded process identity against this machine. It is the same process only when the
 * host, the boot id, the pid AND the start time all match; an alive pid with another start time is a
 * recycled pid and is not ours. Reads /proc only; signals nothing.
 */
export function describeSurvivor(id: ProcessIdentity): SurvivorDescription {
  if (id.host !== hostName()) return { state: "other_host", members: [] };
  if (id.boot_id !== bootId()) return { state: "other_boot", members: [] };
  const members = liveGroupMembers(id.pgid);
  const stat = readProcStat(id.pid);
  if (stat === null || isDead(stat)) return { state: "gone", members };
  if (stat.startTime !== id.start_time) return { state: "recycled", members };
  return { state: "same_process", members };
}

/** What {@link stopSurvivor} did. */
export interface SurvivorStopResult {
  /** True only when Cairn is sure the recorded process and its group are not running. */
  readonly worker_stopped: boolean;
  /** One sentence for the UnknownExecution record and for the model. */
  readonly detail: string;
}

/**
 * Makes sure a process recorded by an earlier run is not running, without ever signalling a process
 * that is not provably ours.
 *
 * - same process, or the leader gone but live members left in its process group (same boot): SIGTERM
 *   to the whole group, `graceMs` (default 2000), SIGKILL, then confirm from /proc that the group is
 *   empty: `worker_stopped` true (false if it could not be emptied, e.g. another user's processes).
 * - gone and no member left: true ("not running").
 * - recycled pid: FAILS CLOSED. Nothing is signalled; false, saying the pid now belongs to another process.
 * - other boot: true (the machine restarted, so it cannot be running). Other host: false (cannot check).
 *
 * Note on "gone with members": the kernel never hands out a pid that is still in use as a process
 * group id, so live members of group `pgid` descend from a process that had pid `pgid`.
 */
export async function stopSurvivor(id: ProcessIdentity, options: { graceMs?: number } = {}): Promise<SurvivorStopResult> {
  const graceMs = options.graceMs ?? 2000;
  const found = describeSurvivor(id);
  switch (found.state) {
    case "other_host":
      return {
        worker_stopped: false,
        detail: `the process (pid ${id.pid}) ran on host "${id.host}", not on this host ("${hostName()}"); it cannot be checked or stopped from here`,
      };
    case "other_boot":
      return {
        worker_stopped: true,
        detail: `the machine restarted since the process (pid ${id.pid}) was started (boot id changed), so it cannot be running`,
      };
    case "recycled":
      return {
        worker_stopped: false,
        detail: `pid ${id.pid} was reused by another process (start time ${processStartTime(id.pid) ?? "?"}, recorded ${id.start_time}); the original process could not be confirmed stopped, and nothing was signalled`,
      };
    case "gone":
      if (found.members.length === 0) {
        return { worker_stopped: true, detail: `not running: pid ${id.pid} has exited and no process remains in its process group ${id.pgid}` };
      }
      break;
    case "same_process":
      break;
  }
  const who =
    found.state === "same_process"
      ? `process ${id.pid} was still running`
      : `process ${id.pid} had exited but ${found.members.length} process(es) of its group were still running (${found.members.join(", ")})`;
  const stopped = await terminateGroup(id.pgid, { graceMs });
  const how = stopped.signals.length === 0 ? "it exited by itself" : `sent ${stopped.signals.join(" then ")} to process group ${id.pgid}`;
  if (stopped.empty) return { worker_stopped: true, detail: `${who}; ${how}; the group is now empty` };
  if (stopped.permissionDenied) {
    return { worker_stopped: false, detail: `${who}; not permitted to signal process group ${id.pgid}; processes ${stopped.remaining.join(", ")} may still be running` };
  }
  return { worker_stopped: false, detail: `${who}; ${how}, but processes ${stopped.remaining.join(", ")} are still in the group` };
}
