/**
 * Review of the keeper's restart and continue paths (src/exec/keeper.ts) with real processes: an
 * owner process uses CellKeeper; the test stops, kills and re-kills its keeper and freezes the owner.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { sleep, until } from "../support/wait.js";

const KEEPER = pathToFileURL(new URL("../../src/exec/keeper.ts", import.meta.url).pathname).href;
const IDENTITY = pathToFileURL(new URL("../../src/exec/identity.ts", import.meta.url).pathname).href;

/** Owner: argv remaining, label. Commands: spawn, drop PID, close-clear, close-keep, pid. */
const OWNER = `
import { spawn } from "node:child_process";
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
setInterval(() => {}, 1000);
setTimeout(() => console.log("ready " + first + " " + keeper.pid), 100);
createInterface({ input: process.stdin }).on("line", (line) => {
  const [cmd, arg] = line.split(" ");
  if (cmd === "spawn") console.log("cell " + cell());
  if (cmd === "drop") keeper.drop(Number(arg));
  if (cmd === "close-clear") keeper.close(true);
  if (cmd === "close-keep") keeper.close(false);
  if (cmd === "pid") console.log("keeper " + keeper.pid + " " + keeper.keepersStarted);
  console.log("done " + line);
});
`;

const procState = (pid: number): string | null => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  } catch {
    return null;
  }
};
const alive = (pid: number): boolean => {
  const s = procState(pid);
  return s !== null && s !== "Z";
};

/** Live (not zombie) keeper processes whose command line names `label`. */
function keepers(label: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, "utf8").split("\0").join(" ");
      if (cmd.includes("cairn-keeper") && cmd.includes(label) && alive(Number(d))) out.push(Number(d));
    } catch {
      // gone
    }
  }
  return out;
}

const spawned: ChildProcess[] = [];
const pids: number[] = [];
after(() => {
  for (const c of spawned) c.kill("SIGKILL");
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
});

let n = 0;
async function owner(remainingMs: number) {
  const label = `kreview-${process.pid}-${n++}`;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", OWNER, String(remainingMs), label], { stdio: ["pipe", "pipe", "inherit"] });
  spawned.push(child);
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
  const ready = await until("ready", () => lines.find((l) => l.startsWith("ready ")), 60_000);
  const [, cell, keeper] = ready.split(" ").map(Number);
  pids.push(cell!, keeper!);
  const say = async (line: string) => {
    const seen = lines.filter((l) => l === `done ${line}`).length;
    child.stdin!.write(`${line}\n`);
    await until(`answer to ${line}`, () => lines.filter((l) => l === `done ${line}`).length > seen, 60_000);
  };
  const keeperNow = async () => {
    await say("pid");
    const [, pid, started] = lines.filter((l) => l.startsWith("keeper ")).at(-1)!.split(" ").map(Number);
    if (pid) pids.push(pid);
    return { pid: pid!, started: started! };
  };
  const spawnCell = async () => {
    await say("spawn");
    const c = Number(lines.filter((l) => l.startsWith("cell ")).at(-1)!.split(" ")[1]);
    pids.push(c);
    return c;
  };
  return { child, cell: cell!, keeper: keeper!, label, say, keeperNow, spawnCell };
}

describe("cell keeper, review", () => {
  it("a keeper killed twice within a second (the replacement too) still holds the cell when the owner then freezes", async () => {
    const o = await owner(1500);
    process.kill(o.keeper, "SIGKILL");
    const k2 = await until("a second keeper", async () => {
      const k = await o.keeperNow();
      return k.started === 2 && k.pid !== o.keeper && alive(k.pid) ? k : undefined;
    }, 60_000, 20);
    process.kill(k2.pid, "SIGKILL"); // within a second of its start: the restart is delayed
    await sleep(100); // the owner sees the exit, then freezes before the delayed restart
    o.child.kill("SIGSTOP");
    await sleep(6000); // four lease lengths
    const held = !alive(o.cell);
    o.child.kill("SIGKILL");
    assert.ok(held, `the frozen owner's cell ${o.cell} still runs 6 s after the deadline: no keeper held it (keepers alive: ${keepers(o.label).length})`);
  });

  it("a keeper stopped (SIGSTOP) when its owner closes clearing its cells is not left stopped, and never kills the cleared cell", async () => {
    const o = await owner(1500);
    process.kill(o.keeper, "SIGSTOP");
    // At once: the owner's next beat (within 250 ms) would continue it first. Then close sees it
    // stopped, and must neither leave it stopped nor let it act on its old deadline later.
    await o.say("close-clear");
    await sleep(2500); // past the deadline the keeper had
    const state = procState(o.keeper);
    try {
      process.kill(o.keeper, "SIGCONT"); // anyone (the cell, an operator) could continue it later
    } catch {
      // gone: the owner ended it
    }
    await sleep(1500);
    const cellAlive = alive(o.cell);
    o.child.kill("SIGKILL");
    assert.ok(cellAlive, `the cleared cell ${o.cell} was killed by the keeper once it was continued (keeper state before continue: ${state})`);
    assert.notEqual(state, "T", "the keeper is left stopped forever after its owner closed");
  });

  it("a dropped group is not handed to a replacement keeper; the kept one is killed when the owner freezes", async () => {
    const o = await owner(1500);
    const dropped = await o.spawnCell();
    const kept = await o.spawnCell();
    await o.say(`drop ${dropped}`);
    await o.say(`drop ${o.cell}`);
    process.kill(o.keeper, "SIGKILL");
    await until("a second keeper", async () => {
      const k = await o.keeperNow();
      return k.started === 2 && alive(k.pid) ? k : undefined;
    }, 60_000);
    await sleep(1500);
    o.child.kill("SIGSTOP");
    await until("the kept cell killed", () => !alive(kept), 60_000);
    await sleep(1000);
    assert.ok(alive(dropped), "a dropped group was killed by the replacement keeper");
    assert.ok(alive(o.cell), "a dropped group was killed by the replacement keeper");
    o.child.kill("SIGKILL");
  });

  it("keepers killed repeatedly while cells are added and dropped: one keeper at a time, every held cell killed at the freeze", async () => {
    const o = await owner(1500);
    const cells: number[] = [o.cell];
    for (let i = 0; i < 8; i++) {
      const k = await o.keeperNow();
      if (alive(k.pid)) process.kill(k.pid, "SIGKILL");
      cells.push(await o.spawnCell());
      if (i % 3 === 2) await o.say(`drop ${cells.shift()}`);
      assert.ok(keepers(o.label).length <= 1, `keepers piled up: ${keepers(o.label).join(",")}`);
      await sleep(150);
    }
    await until("a keeper after the last kill", async () => alive((await o.keeperNow()).pid), 60_000);
    await sleep(1200);
    assert.equal(keepers(o.label).length, 1, "exactly one keeper runs");
    for (const c of cells) assert.ok(alive(c), `held cell ${c} killed while the owner beats`);
    o.child.kill("SIGSTOP");
    for (const c of cells) await until(`held cell ${c} killed at the deadline`, () => !alive(c), 30_000);
    o.child.kill("SIGKILL");
    await until("the keeper to exit", () => keepers(o.label).length === 0, 30_000);
  });

  it("no keeper is started after close(), even with a restart pending", async () => {
    const o = await owner(1500);
    process.kill(o.keeper, "SIGKILL");
    const k2 = await until("a second keeper", async () => {
      const k = await o.keeperNow();
      return k.started === 2 && alive(k.pid) ? k : undefined;
    }, 60_000, 20);
    process.kill(k2.pid, "SIGKILL"); // restart delayed by up to a second
    await o.say("close-clear");
    await sleep(2500);
    const k = await o.keeperNow();
    assert.equal(k.started, 2, "a keeper was started after close()");
    assert.deepEqual(keepers(o.label), [], "a keeper runs after close()");
    assert.ok(alive(o.cell), "a cleared cell was killed");
    o.child.kill("SIGKILL");
  });
});
