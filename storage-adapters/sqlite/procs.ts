/**
 * What the sqlite adapter asks Linux about other processes on this host, for liveness only (never
 * safety: the owner epoch fences): is a pid alive, is it stopped (SIGSTOP), which processes hold a
 * write lock on a SQLite file, and ending one with SIGKILL. A process frozen while it holds SQLite's
 * write lock keeps that lock (fcntl locks belong to the process, and a stopped process never releases
 * them), so every other writer of the file gets SQLITE_BUSY until the process is thawed or killed.
 */
import { readFileSync, statSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

/** Whether a process with this pid exists (EPERM: it exists, owned by someone else). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

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

function inodeOf(path: string): number | null {
  try {
    return statSync(path).ino;
  } catch {
    return null;
  }
}

/**
 * The processes holding an exclusive (WRITE) fcntl lock on the SQLite file `path` or on its `-shm`
 * (in WAL mode the writer's lock is byte 120 of the -shm; in rollback mode the RESERVED, PENDING and
 * EXCLUSIVE bytes of the file), read from /proc/locks. Locks are matched by inode, which is what
 * /proc/locks names. Empty when nothing holds one, or when /proc/locks cannot be read.
 */
export function writeLockHolders(path: string): number[] {
  const inodes = new Set([inodeOf(path), inodeOf(`${path}-shm`)].filter((i): i is number => i !== null));
  if (inodes.size === 0) return [];
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
    const inode = Number(f[5]?.split(":")[2]);
    if (Number.isInteger(pid) && pid > 0 && inodes.has(inode)) pids.add(pid);
  }
  return [...pids];
}

/** SIGKILLs `pid` and waits (at most 5 s) until it is gone or a zombie, which has released its locks. */
export async function killAndWait(pid: number): Promise<void> {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return; // gone meanwhile
  }
  for (let i = 0; i < 100; i++) {
    const s = procState(pid);
    if (s === null || s === "Z") return;
    await sleep(50);
  }
}
