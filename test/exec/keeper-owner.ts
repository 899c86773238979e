/**
 * What the keeper's process tests share (keeper.test.ts, keeper-spill-review.test.ts): the owner
 * script they run as a separate node process, starting it and ending everything it started, and the
 * /proc helpers that watch its processes.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { until } from "../support/wait.js";

const KEEPER = pathToFileURL(new URL("../../src/exec/keeper.ts", import.meta.url).pathname).href;
const IDENTITY = pathToFileURL(new URL("../../src/exec/identity.ts", import.meta.url).pathname).href;

/**
 * The owner: launches `sleep 600` in its own group, holds it with a keeper whose lease is always
 * `remaining` ms from now (argv[1]; as if renewed in time for as long as the owner runs; argv[2] is
 * the keeper's label), prints "ready CELL KEEPER", and obeys lines on stdin, answering each with
 * "done LINE": "spawn" (another cell), "drop PID", "close-clear", "close-keep", "add-wrong" (the
 * first cell again with a wrong start time), "pid" (the keeper's pid and how many keepers were
 * started), "break missing" / "break nul" (keepers cannot be started: the node binary is gone, so
 * spawn emits "error"; or spawn throws at once), "fix" (they can again), "fill N" (N more groups,
 * whose pids cannot exist), "fds" (prints "fds COUNT SPILLS": its open descriptors, and how many
 * of them are a keeper's spill file), "tmpdir PATH" (sets TMPDIR, which os.tmpdir() reads on every
 * call). An uncaught error or rejection ends the owner with "crash" on stdout.
 */
export const OWNER = `
import { spawn } from "node:child_process";
import { readdirSync, readlinkSync } from "node:fs";
import { createInterface } from "node:readline";
import { CellKeeper } from ${JSON.stringify(KEEPER)};
import { processStartTime } from ${JSON.stringify(IDENTITY)};
const remaining = Number(process.argv[1]);
const keeper = new CellKeeper(() => remaining, process.argv[2]);
function cell() {
  const c = spawn("sleep", ["600"], { detached: true, stdio: "ignore" });
  c.unref();
  keeper.add(c.pid, processStartTime(c.pid));
  return c.pid;
}
const first = cell();
const execPath = process.execPath;
process.on("uncaughtException", (err) => { console.log("crash " + JSON.stringify(String(err))); process.exit(70); });
process.on("unhandledRejection", (err) => { console.log("crash " + JSON.stringify(String(err))); process.exit(70); });
setInterval(() => {}, 1000);
setTimeout(() => console.log("ready " + first + " " + keeper.pid), 100);
function fds() {
  let count = 0, spills = 0;
  for (const fd of readdirSync("/proc/self/fd")) {
    count++;
    // (spelled in two parts: this script's text must not match the keepers() scan of command lines)
    try { if (readlinkSync("/proc/self/fd/" + fd).includes("cairn-" + "keeper-")) spills++; } catch {}
  }
  return count + " " + spills;
}
createInterface({ input: process.stdin }).on("line", (line) => {
  const [cmd, arg] = line.split(" ");
  if (cmd === "spawn") console.log("cell " + cell());
  if (cmd === "drop") keeper.drop(Number(arg));
  if (cmd === "close-clear") keeper.close(true);
  if (cmd === "close-keep") keeper.close(false);
  if (cmd === "add-wrong") keeper.add(first, "1");
  if (cmd === "pid") console.log("keeper " + keeper.pid + " " + keeper.keepersStarted);
  if (cmd === "break") process.execPath = arg === "nul" ? "node" + String.fromCharCode(0) : "/nonexistent/cairn-test/node";
  if (cmd === "fix") process.execPath = execPath;
  // groups that cannot exist (above Linux's largest pid_max), as many as asked
  if (cmd === "fill") for (let i = 0; i < Number(arg); i++) keeper.add(4194305 + i, "1");
  if (cmd === "fds") console.log("fds " + fds());
  if (cmd === "tmpdir") process.env.TMPDIR = arg;
  console.log("done " + line);
});
`;

/** The fields of /proc/PID/stat after the name (state first, then ppid), or null when it is gone. */
export const procFields = (pid: number): string[] | null => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return null;
  }
};
export const procState = (pid: number): string | null => procFields(pid)?.[0] ?? null;
export const alive = (pid: number): boolean => {
  const s = procState(pid);
  return s !== null && s !== "Z";
};

/** Live (not zombie) keeper processes whose command line names `label` (their title: "cairn-keeper LABEL"). */
export function keepers(label: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const parts = readFileSync(`/proc/${d}/cmdline`, "utf8").split("\0").join(" ").trim().split(/\s+/);
      if (parts[0] === "cairn-keeper" && parts[1] === label && alive(Number(d))) out.push(Number(d));
    } catch {
      // gone
    }
  }
  return out;
}

/** Owner processes, cells and keepers the tests started: `killOwners` ends them all (in `after`). */
const spawned: ChildProcess[] = [];
const labels: string[] = [];
export const pids: number[] = [];

/** SIGKILLs (after a SIGCONT) every owner started here, every keeper of theirs, and every tracked pid and its group. */
export function killOwners(): void {
  for (const c of spawned) {
    try {
      c.kill("SIGCONT");
    } catch {
      // gone
    }
    c.kill("SIGKILL");
  }
  for (const label of labels) for (const k of keepers(label)) pids.push(k);
  for (const pid of pids) {
    for (const p of [-pid, pid]) {
      try {
        process.kill(p, "SIGCONT");
        process.kill(p, "SIGKILL");
      } catch {
        // gone
      }
    }
  }
}

let n = 0;
/** Starts an OWNER (its keeper labelled `${prefix}-PID-N`, with `env` added to its environment) and waits until it is ready. */
export async function startOwner(remainingMs: number, prefix: string, env: Record<string, string> = {}) {
  const label = `${prefix}-${process.pid}-${n++}`;
  labels.push(label);
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", OWNER, String(remainingMs), label], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, ...env },
  });
  spawned.push(child);
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
  const ready = await until("ready", () => {
    if (child.exitCode !== null) throw new Error(`the owner exited ${child.exitCode}`);
    return lines.find((l) => l.startsWith("ready "));
  }, 60_000);
  const [, cell, keeper] = ready.split(" ").map(Number);
  pids.push(cell!, keeper!);
  const crashed = () => lines.find((l) => l.startsWith("crash ")) ?? (child.exitCode !== null || child.signalCode !== null ? `exited ${child.exitCode ?? child.signalCode}` : undefined);
  const say = async (line: string) => {
    const seen = lines.filter((l) => l === `done ${line}`).length;
    child.stdin!.write(`${line}\n`);
    await until(`answer to ${line}`, () => {
      const crash = crashed();
      if (crash !== undefined) throw new Error(`the owner crashed: ${crash}`);
      return lines.filter((l) => l === `done ${line}`).length > seen;
    }, 60_000).catch((err: Error) => {
      throw new Error(`${err.message}; owner ${child.pid} state ${procState(child.pid!)}; last lines ${lines.slice(-3).join(" | ")}`);
    });
  };
  const keeperNow = async () => {
    await say("pid");
    const [, pid, started] = lines.filter((l) => l.startsWith("keeper ")).at(-1)!.split(" ").map(Number);
    if (pid) pids.push(pid);
    return { pid: pid!, started: started! };
  };
  const fds = async () => {
    await say("fds");
    const [, count, spills] = lines.filter((l) => l.startsWith("fds ")).at(-1)!.split(" ").map(Number);
    return { count: count!, spills: spills! };
  };
  const spawnCell = async () => {
    await say("spawn");
    const c = Number(lines.filter((l) => l.startsWith("cell ")).at(-1)!.split(" ")[1]);
    pids.push(c);
    return c;
  };
  return { child, cell: cell!, keeper: keeper!, label, say, keeperNow, fds, spawnCell, crashed };
}

/**
 * SIGKILLs keeper `current` of owner `o` and SIGSTOPs the owner the moment its replacement appears
 * in /proc (a busy poll, up to 60 s), so the owner cannot have written the new keeper anything
 * after starting it. Returns the new keeper's pid (tracked for `killOwners`); throws when none came.
 */
export function freezeOwnerAtNewKeeper(o: { readonly child: ChildProcess; readonly label: string }, current: number): number {
  process.kill(current, "SIGKILL");
  let next: number | undefined;
  const t0 = performance.now();
  while (next === undefined && performance.now() - t0 < 60_000) next = keepers(o.label).find((pid) => pid !== current);
  o.child.kill("SIGSTOP");
  if (next === undefined) throw new Error("no new keeper appeared within 60 s");
  pids.push(next);
  return next;
}
