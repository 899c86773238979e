/**
 * The cell keeper's program: the process `CellKeeper` (keeper.ts) starts beside an owner. It imports
 * nothing but node:fs (through procfs.ts), so it starts in a few tens of milliseconds and holds
 * little memory.
 *
 * Its arguments (after its program: a path, or "cairn-keeper" when node runs it as `-e` code): the
 * label, the deadline, the groups held ("PGID:START,...", at most
 * ARGV_GROUPS), and "fd3" when there are more: the rest are in the file open as its fd 3 (see spill
 * in keeper.ts). So it holds them all from its first instruction: an owner that freezes right after
 * starting it (before writing a line) is still covered. Then it reads commands from stdin, one per
 * line: `beat DEADLINE|none`, `add PGID START`, `drop PGID`, `clear`. A deadline is a time on
 * CLOCK_MONOTONIC in nanoseconds (process.hrtime), one clock for every process on the machine: a
 * line that arrives late never moves it.
 *
 * When the deadline passes without a newer one, it SIGKILLs every group it holds, except one whose
 * leader is alive with another start time (the pid was recycled: the group is long gone). When its
 * stdin ends (the owner exited or closed), it still kills what it holds at the deadline, then exits.
 * SIGTERM and SIGINT are ignored: a cell's or a terminal's signal must not end it early.
 */
import { closeSync, fstatSync, readSync } from "node:fs";
import { readProcStat } from "./procfs.js";

const [label, deadlineArg, argvGroups, more] = process.argv.slice(2);
process.title = `cairn-keeper ${label ?? ""}`;

/** Process group id to its leader's start time (as /proc reports it). */
const groups = new Map<number, string>();

function hold(list: string): void {
  for (const g of list.split(",")) {
    const [pgid, start] = g.split(":");
    if (Number(pgid) > 1 && start !== undefined) groups.set(Number(pgid), start);
  }
}

/** The groups beyond the arguments, in an unlinked file the owner wrote before starting this keeper. */
function readSpill(fd: number): string {
  const size = fstatSync(fd).size;
  const buf = Buffer.alloc(size);
  let at = 0;
  while (at < size) {
    const n = readSync(fd, buf, at, size - at, at);
    if (n === 0) break;
    at += n;
  }
  closeSync(fd);
  return buf.toString("latin1", 0, at);
}

const parseDeadline = (s: string | undefined): bigint | null => (s !== undefined && /^[0-9]+$/.test(s) ? BigInt(s) : null);

hold(argvGroups ?? "");
if (more === "fd3") hold(readSpill(3));
let deadline = parseDeadline(deadlineArg);
let timer: NodeJS.Timeout | null = null;
let ended = false;

function killAll(): void {
  for (const [pgid, start] of groups) {
    const now = readProcStat(pgid)?.startTime ?? null;
    if (now !== null && now !== start) continue;
    try {
      process.kill(-pgid, "SIGKILL");
    } catch (_err) {
      // the group is gone already
    }
  }
  groups.clear();
}

/** (Re)arms the kill for the current deadline; exits once the owner is gone and nothing is held. */
function arm(): void {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  if (groups.size === 0) {
    if (ended) process.exit(0);
    return;
  }
  if (deadline === null) return;
  const ms = Number((deadline - process.hrtime.bigint()) / 1_000_000n);
  timer = setTimeout(() => {
    killAll();
    if (ended) process.exit(0);
  }, Math.max(0, ms));
}

function obey(line: string): void {
  const [cmd, a, b] = line.split(" ");
  if (cmd === "beat") deadline = a === "none" ? null : (parseDeadline(a) ?? deadline);
  else if (cmd === "add" && Number(a) > 1 && b !== undefined) groups.set(Number(a), b);
  else if (cmd === "drop") groups.delete(Number(a));
  else if (cmd === "clear") groups.clear();
}

let pending = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk: string) => {
  pending += chunk;
  let i: number;
  while ((i = pending.indexOf("\n")) >= 0) {
    obey(pending.slice(0, i));
    pending = pending.slice(i + 1);
  }
  arm();
});
process.stdin.on("end", () => {
  ended = true;
  arm();
});
process.on("SIGTERM", () => {});
process.on("SIGINT", () => {});
arm();
