/**
 * The cell keeper (src/exec/keeper.ts) with real processes: an owner process (node) launches a cell
 * (`sleep`, in its own process group) and hands it to its keeper; then the owner is frozen with
 * SIGSTOP, killed with SIGKILL, or closes. The keeper must kill the cell's group at the owner's lease
 * deadline when the owner cannot (frozen, dead), not before it (same-host recovery still finds the
 * survivor of a crash until then), never when the owner says it stopped its cells itself, and never
 * a group whose leader's start time is not the one it was given (a recycled pid). A cell can reach
 * its keeper: a stopped keeper is continued, a killed one replaced, and the cell is still held.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { sleep, until } from "../support/wait.js";

const KEEPER = pathToFileURL(new URL("../../src/exec/keeper.ts", import.meta.url).pathname).href;
const IDENTITY = pathToFileURL(new URL("../../src/exec/identity.ts", import.meta.url).pathname).href;

/**
 * The owner: launches `sleep 600` in its own group, holds it with a keeper whose lease is always
 * `remaining` ms from now (as if renewed in time for as long as the owner runs), prints
 * "ready CELL KEEPER", and obeys lines on stdin: "close-clear", "close-keep", "add-wrong".
 */
const OWNER = `
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { CellKeeper } from ${JSON.stringify(KEEPER)};
import { processStartTime } from ${JSON.stringify(IDENTITY)};
const remaining = Number(process.argv[1]);
const keeper = new CellKeeper(() => remaining, "keeper-test");
const cell = spawn("sleep", ["600"], { detached: true, stdio: "ignore" });
cell.unref();
keeper.add(cell.pid, processStartTime(cell.pid));
setInterval(() => {}, 1000);
setTimeout(() => console.log("ready " + cell.pid + " " + keeper.pid), 100);
createInterface({ input: process.stdin }).on("line", (line) => {
  if (line === "close-clear") keeper.close(true);
  if (line === "close-keep") keeper.close(false);
  if (line === "add-wrong") keeper.add(cell.pid, "1");
  if (line === "pid") console.log("keeper " + keeper.pid + " " + keeper.keepersStarted);
  console.log("done " + line);
});
`;

/** Running (a zombie is not: a killed cell of a frozen owner stays one until its parent reaps it). */
const alive = (pid: number): boolean => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
};

const spawned: ChildProcess[] = [];
const cells: number[] = [];

after(() => {
  for (const c of spawned) c.kill("SIGKILL");
  for (const pid of cells) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      // gone
    }
  }
});

/** The process state letter from /proc (T: stopped), or null when gone. */
const procState = (pid: number): string | null => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  } catch {
    return null;
  }
};

async function owner(remainingMs: number): Promise<{ child: ChildProcess; cell: number; keeper: number; say: (line: string) => Promise<void>; keeperNow: () => Promise<{ pid: number; started: number }> }> {
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", OWNER, String(remainingMs)], { stdio: ["pipe", "pipe", "inherit"] });
  spawned.push(child);
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
  const ready = await until("the owner's ready line", () => lines.find((l) => l.startsWith("ready ")), 60_000);
  const [, cell, keeper] = ready.split(" ").map(Number);
  cells.push(cell!);
  assert.ok(alive(cell!) && alive(keeper!), "the cell and the keeper run");
  return {
    child,
    cell: cell!,
    keeper: keeper!,
    say: async (line) => {
      const seen = lines.filter((l) => l === `done ${line}`).length;
      child.stdin!.write(`${line}\n`);
      await until(`the owner's answer to ${line}`, () => lines.filter((l) => l === `done ${line}`).length > seen, 60_000);
    },
    keeperNow: async () => {
      const seen = lines.filter((l) => l === "done pid").length;
      child.stdin!.write("pid\n");
      await until("the owner's answer to pid", () => lines.filter((l) => l === "done pid").length > seen, 60_000);
      const [, pid, started] = lines.filter((l) => l.startsWith("keeper ")).at(-1)!.split(" ").map(Number);
      return { pid: pid!, started: started! };
    },
  };
}

describe("cell keeper", () => {
  it("kills the cell's group once the lease deadline passes while the owner is frozen (SIGSTOP)", async () => {
    const o = await owner(1500);
    await sleep(2500); // beats go on while the owner runs: the cell lives past the first deadline
    assert.ok(alive(o.cell), "the cell outlives one lease length while its owner beats");
    o.child.kill("SIGSTOP");
    await until("the frozen owner's cell to be killed", () => !alive(o.cell), 60_000);
    assert.ok(alive(o.keeper), "the keeper stays while its owner's pipe is open");
    o.child.kill("SIGKILL");
    await until("the keeper to exit once the owner is gone", () => !alive(o.keeper), 60_000);
  });

  it("after the owner is SIGKILLed, the cell survives until the deadline (same-host recovery finds it), then is killed", async () => {
    const o = await owner(20_000);
    o.child.kill("SIGKILL");
    await sleep(1000);
    assert.ok(alive(o.cell), "the survivor still runs 1 s after its owner died (deadline 20 s)");
    await until("the dead owner's cell to be killed at its deadline", () => !alive(o.cell), 90_000);
    await until("the keeper to exit", () => !alive(o.keeper), 30_000);
  });

  it("an owner that stopped its cells itself clears them: the keeper exits and kills nothing", async () => {
    const o = await owner(1000);
    await o.say("close-clear");
    await until("the keeper to exit", () => !alive(o.keeper), 30_000);
    await sleep(2000);
    assert.ok(alive(o.cell), "a cleared cell is never killed by the keeper");
  });

  it("a closed owner that did not stop its cells leaves them to the deadline", async () => {
    const o = await owner(1000);
    await o.say("close-keep");
    await until("the kept cell to be killed at the deadline", () => !alive(o.cell), 60_000);
    await until("the keeper to exit", () => !alive(o.keeper), 30_000);
  });

  it("a keeper stopped by a cell (SIGSTOP) is continued by its owner, and still kills the cell when the owner freezes", async () => {
    const o = await owner(1500);
    process.kill(o.keeper, "SIGSTOP");
    // The stop takes effect when the keeper is next scheduled: look only after that (the owner
    // continues it within one beat, 250 ms; without that it stays stopped and the wait below fails).
    await sleep(1000);
    await until("the stopped keeper to be continued", () => procState(o.keeper) !== "T" && procState(o.keeper) !== "t", 60_000);
    assert.ok(alive(o.cell), "the cell still runs while its owner beats");
    o.child.kill("SIGSTOP");
    await until("the frozen owner's cell to be killed by the continued keeper", () => !alive(o.cell), 60_000);
    o.child.kill("SIGKILL");
  });

  it("a keeper killed by a cell (SIGKILL) is replaced, and the new one holds the cell to the lease", async () => {
    const o = await owner(1500);
    process.kill(o.keeper, "SIGKILL");
    const next = await until("a new keeper", async () => {
      const k = await o.keeperNow();
      return k.pid !== o.keeper && k.started === 2 && alive(k.pid) ? k : undefined;
    }, 60_000);
    await sleep(2500); // the new keeper got the lease's deadline and renewals: the cell lives on
    assert.ok(alive(o.cell), "the cell outlives one lease length while its owner beats");
    o.child.kill("SIGSTOP");
    await until("the frozen owner's cell to be killed by the new keeper", () => !alive(o.cell), 60_000);
    assert.ok(alive(next.pid), "the new keeper stays while its owner's pipe is open");
    o.child.kill("SIGKILL");
    await until("the new keeper to exit once the owner is gone", () => !alive(next.pid), 60_000);
  });

  it("never signals a group whose leader started at another time (a recycled pid)", async () => {
    const o = await owner(1000);
    await o.say("add-wrong"); // the same pgid again, with a start time that is not its leader's
    o.child.kill("SIGSTOP");
    await sleep(4000); // two deadlines past
    assert.ok(alive(o.cell), "the group was not signalled: its leader's start time did not match");
    o.child.kill("SIGKILL");
  });
});
