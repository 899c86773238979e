/**
 * Reading Linux's /proc: one process's stat line, and which processes are in a process group.
 *
 * Every function here answers "not found" with `null` or an empty list (a process can exit between
 * the directory listing and the read; that race is normal, not an error).
 */
import { readdirSync, readFileSync } from "node:fs";

/** The fields of /proc/PID/stat that Cairn uses. */
export interface ProcStat {
  readonly pid: number;
  /** One letter: R, S, D, Z (zombie: exited, not yet reaped), T, X ... */
  readonly state: string;
  readonly ppid: number;
  readonly pgid: number;
  readonly sid: number;
  /** Field 22, clock ticks after boot, kept as the decimal string the kernel wrote. */
  readonly startTime: string;
}

/**
 * Parses one /proc/PID/stat line. The command name (field 2) is in parentheses and may itself
 * contain spaces and parentheses, so the fields are split after the LAST ')'.
 * Returns null when the line is not a stat line.
 */
export function parseProcStat(line: string): ProcStat | null {
  const open = line.indexOf("(");
  const close = line.lastIndexOf(")");
  if (open <= 0 || close < open) return null;
  const pid = Number(line.slice(0, open).trim());
  // After ") " come fields 3 (state), 4 (ppid), 5 (pgrp), 6 (session) ... 22 (starttime).
  const rest = line.slice(close + 1).trim().split(/\s+/);
  const field = (n: number): string | undefined => rest[n - 3];
  const state = field(3);
  const ppid = Number(field(4));
  const pgid = Number(field(5));
  const sid = Number(field(6));
  const startTime = field(22);
  if (!Number.isInteger(pid) || state === undefined || startTime === undefined || !/^\d+$/.test(startTime)) return null;
  if (!Number.isInteger(ppid) || !Number.isInteger(pgid) || !Number.isInteger(sid)) return null;
  return { pid, state, ppid, pgid, sid, startTime };
}

/** Reads /proc/PID/stat; null when there is no such process (or /proc cannot be read). */
export function readProcStat(pid: number): ProcStat | null {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  let line: string;
  try {
    line = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch (_err) {
    return null;
  }
  return parseProcStat(line);
}

/** True when the stat describes a process that has exited (zombie or dead) and runs nothing. */
export function isDead(stat: ProcStat): boolean {
  return stat.state === "Z" || stat.state === "X" || stat.state === "x";
}

/**
 * The live (non-zombie) processes whose process group is `pgid`, by scanning /proc/*\/stat,
 * in ascending pid order. Empty when the group has no live member.
 */
export function liveGroupMembers(pgid: number): number[] {
  if (!Number.isInteger(pgid) || pgid <= 0) return [];
  // Fast path, the common case once a cell has exited: the kernel knows no process of the group at
  // all (ESRCH), zombies included, so a scan of /proc would find none either. (Never for pgid 1:
  // kill(-1) means every process.)
  if (pgid > 1) {
    try {
      process.kill(-pgid, 0);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") return [];
    }
  }
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch (_err) {
    return [];
  }
  const members: number[] = [];
  for (const name of entries) {
    if (!/^\d+$/.test(name)) continue;
    const stat = readProcStat(Number(name));
    if (stat !== null && stat.pgid === pgid && !isDead(stat)) members.push(stat.pid);
  }
  return members.sort((a, b) => a - b);
}
