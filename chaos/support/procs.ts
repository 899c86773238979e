/**
 * Reading /proc for the chaos suite, independently of src/exec (the code under test): is a process
 * alive, what is its start time, which live processes are in a group. And a cleanup registry that
 * kills, by pid AND start time, only the processes the suite itself caused to exist.
 *
 * On this machine pid 1 does not reap orphans, so an exited orphan stays a zombie (state Z): a zombie
 * runs nothing and counts as gone everywhere here.
 */
import { readdirSync, readFileSync } from "node:fs";

/** The fields of /proc/PID/stat the suite needs, or null when there is no such process. */
export interface Stat {
  readonly pid: number;
  readonly state: string;
  readonly pgid: number;
  readonly startTime: string;
}

/** Reads /proc/PID/stat (fields split after the last ')', as the command name may hold spaces). */
export function stat(pid: number): Stat | null {
  let line: string;
  try {
    line = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  const rest = line.slice(line.lastIndexOf(")") + 1).trim().split(/\s+/);
  const state = rest[0];
  const pgid = Number(rest[2]);
  const startTime = rest[19];
  if (state === undefined || startTime === undefined) return null;
  return { pid, state, pgid, startTime };
}

/** True when `pid` is a live process (not a zombie); with `startTime`, only when it is that very process. */
export function alive(pid: number, startTime?: string): boolean {
  const s = stat(pid);
  if (s === null || s.state === "Z" || s.state === "X") return false;
  return startTime === undefined || s.startTime === startTime;
}

/** The live (non-zombie) members of process group `pgid`. */
export function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const s = stat(Number(name));
    if (s !== null && s.pgid === pgid && s.state !== "Z" && s.state !== "X") out.push(s.pid);
  }
  return out;
}

/**
 * Live processes whose command line is exactly `argv`: how the suite finds, on this host, a process
 * a sandboxed cell started (inside its PID namespace, `$!` and `$$` are not this host's pids).
 */
export function processesRunning(argv: readonly string[]): number[] {
  const want = `${argv.join("\0")}\0`;
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, "utf8") === want && alive(Number(name))) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Polling with a hang guard, shared by every test (test/support/wait.ts). */
export { until } from "../../test/support/wait.js";

/** Processes the suite caused to exist, each by pid and start time. */
const tracked = new Map<number, string>();

/** Remembers `pid` (if alive now) so that {@link killTracked} stops it if it still runs. */
export function track(pid: number): void {
  const s = stat(pid);
  if (s !== null) tracked.set(pid, s.startTime);
}

/**
 * SIGKILLs every tracked process that is still the same process (pid AND start time): never a
 * recycled pid. Safe to call many times.
 */
export function killTracked(): void {
  for (const [pid, start] of tracked) {
    if (alive(pid, start)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // it exited in between
      }
    }
    if (!alive(pid, start)) tracked.delete(pid);
  }
}
