/**
 * What the sqlite adapter asks Linux about other processes on this host, for liveness only (never
 * safety: the owner epoch fences): is a process stopped (SIGSTOP), which processes hold a
 * write lock on a SQLite file, and ending one with SIGKILL. A process frozen while it holds SQLite's
 * write lock keeps that lock (fcntl locks belong to the process, and a stopped process never releases
 * them), so every other writer of the file gets SQLITE_BUSY until the process is thawed or killed.
 */
import { readFileSync, statSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

/** The state letter of /proc/PID/stat ("T" stopped, "t" traced, "Z" zombie), or null when there is no such process. */
export function procState(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
  } catch {
    return null;
  }
}

/** Whether `pid` is stopped (SIGSTOP, or stopped under a tracer). */
export function isStopped(pid: number): boolean {
  const s = procState(pid);
  return s === "T" || s === "t";
}

/** "MAJ:MIN:INODE" as /proc/locks names a file (major and minor in hex), or null. */
function idOf(path: string): string | null {
  try {
    const st = statSync(path, { bigint: true });
    const dev = st.dev;
    const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & ~0xfffn);
    const minor = (dev & 0xffn) | ((dev >> 12n) & ~0xffn & 0xffffffffn);
    return `${major.toString(16).padStart(2, "0")}:${minor.toString(16).padStart(2, "0")}:${st.ino}`;
  } catch {
    return null;
  }
}

/**
 * A fingerprint of a process's run: its start time (a reused pid differs), its CPU time and the
 * context switches of its main thread (they change whenever it runs, and never while it is stopped).
 */
export function runMark(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const start = `${f[19]}:${f[11]}:${f[12]}`;
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const v = /voluntary_ctxt_switches:\s*(\d+)/.exec(status)?.[1];
    const nv = /nonvoluntary_ctxt_switches:\s*(\d+)/.exec(status)?.[1];
    return `${start}:${v}:${nv}`;
  } catch {
    return null;
  }
}

/**
 * The processes holding an exclusive (WRITE) fcntl lock on the SQLite file `path` or on its `-shm`
 * (in WAL mode the writer's lock is byte 120 of the -shm; in rollback mode the RESERVED, PENDING and
 * EXCLUSIVE bytes of the file), read from /proc/locks. Locks are matched by device and inode, as
 * /proc/locks names them (inode numbers alone repeat across file systems). Empty when nothing holds
 * one, or when /proc/locks cannot be read.
 */
export function writeLockHolders(path: string): number[] {
  const ids = new Set([idOf(path), idOf(`${path}-shm`)].filter((i): i is string => i !== null));
  if (ids.size === 0) return [];
  let text: string;
  try {
    text = readFileSync("/proc/locks", "utf8");
  } catch {
    return [];
  }
  const pids = new Set<number>();
  for (const line of text.split("\n")) {
    // "7: POSIX  ADVISORY  WRITE 6248 fe:00:2148413 120 120" (lines with "->" are waiters, not holders)
    const f = line.trim().split(/\s+/);
    if (f[1] !== "POSIX" || f[3] !== "WRITE") continue;
    const pid = Number(f[4]);
    if (Number.isInteger(pid) && pid > 0 && ids.has(f[5] ?? "")) pids.add(pid);
  }
  return [...pids];
}

/**
 * SIGKILLs `pid` and waits (at most 5 s) until it is gone or a zombie, which has released its locks.
 * False when it may not be signalled (EPERM); true when it was, or was gone already.
 */
export async function killAndWait(pid: number): Promise<boolean> {
  try {
    process.kill(pid, "SIGKILL");
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== "EPERM";
  }
  for (let i = 0; i < 100; i++) {
    const s = procState(pid);
    if (s === null || s === "Z") return true;
    await sleep(50);
  }
  return true;
}
