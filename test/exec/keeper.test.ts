/**
 * The cell keeper (src/exec/keeper.ts) with real processes: an owner process (node) launches cells
 * (`sleep`, each in its own process group) and hands them to its keeper; then the owner is frozen
 * with SIGSTOP, killed with SIGKILL, or closes. The keeper must kill the cells' groups at the owner's
 * lease deadline when the owner cannot (frozen, dead), not before it (same-host recovery still finds
 * the survivor of a crash until then), never when the owner says it stopped its cells itself, and
 * never a group whose leader's start time is not the one it was given (a recycled pid). A cell can
 * reach its keeper: a stopped keeper is continued, a killed one replaced (at once, also when killed
 * again and again, one keeper at a time), and every held cell is still held; dropped and cleared
 * groups are never handed over or killed.
 */
import { readFileSync } from "node:fs";
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { sleep, until } from "../support/wait.js";
import { alive, keepers, freezeOwnerAtNewKeeper, killOwners, pids, procFields, procState, startOwner } from "./keeper-owner.js";

after(killOwners);

/** An owner whose keeper is labelled kreview-PID-N. */
const owner = (remainingMs: number) => startOwner(remainingMs, "kreview");

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

  // This test was flaky (about 1 run in 3 under load) until the keeper took its deadline and groups
  // in its arguments: it freezes the owner as soon as the last keeper is seen, which could be before
  // the owner had written that keeper its first lines. See the next test, which aims at that moment.
  it("a keeper that keeps dying is restarted at once 5 times in 10 s, then once a second: it never spins, and a keeper comes back", async () => {
    const o = await owner(1500);
    const waits: number[] = []; // from each kill to the next keeper seen
    let current = o.keeper;
    for (let i = 0; i < 7; i++) {
      process.kill(current, "SIGKILL");
      const t0 = performance.now();
      current = await until("the next keeper", () => keepers(o.label).find((pid) => pid !== current), 60_000, 10);
      waits.push(performance.now() - t0);
    }
    // Starts 1 to 5 came at once; the 6th and later wait a second each (a lower bound: load only
    // makes them later, so this cannot fail on a slow machine).
    for (const w of waits.slice(5)) assert.ok(w >= 900, `a restart after 5 in 10 s came after ${Math.round(w)} ms, not once a second: ${waits.map(Math.round).join(", ")}`);
    assert.ok(alive(current), "a keeper runs again");
    o.child.kill("SIGSTOP");
    await until("the frozen owner's cell killed by the last keeper", () => !alive(o.cell), 60_000).catch((err: Error) => {
      const ppid = (pid: number) => procFields(pid)?.[1] ?? "?";
      const cmd = (pid: number) => { try { return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").slice(0, 80); } catch { return "?"; } };
      const ks = keepers(o.label).map((k) => `${k} state ${procState(k)} ppid ${ppid(k)} ${cmd(k)}`);
      throw new Error(`${err.message}; current ${current} (${procState(current)}, ppid ${ppid(current)}); owner ${o.child.pid}; keepers now: ${ks.join(" | ") || "none"}; waits ${waits.map(Math.round).join(", ")}`);
    });
    o.child.kill("SIGKILL");
  });

  it("an owner frozen the moment its new keeper appears (before it could write it a line): that keeper already holds the cell and the deadline", async () => {
    // Without the groups and the deadline in the keeper's arguments, about half of these attempts
    // failed: the new keeper waited for lines its frozen owner never wrote, and the cell ran on.
    for (let attempt = 0; attempt < 3; attempt++) {
      const o = await owner(1500);
      freezeOwnerAtNewKeeper(o, o.keeper);
      await until(`attempt ${attempt}: the cell killed by the keeper its owner froze beside`, () => !alive(o.cell), 30_000);
      o.child.kill("SIGKILL");
    }
  });

  it("an owner holding more groups than fit in one argument, frozen the moment its new keeper appears: that keeper already holds them all", async () => {
    // 15,000 groups as one argument would be about 150 KiB, over Linux's 128 KiB for one argument:
    // spawn would fail with E2BIG at every restart, and no keeper would ever run again. And the ones
    // that do not fit in the arguments must reach the keeper before it runs, not through the pipe
    // afterwards: an owner frozen before its queued writes drained left the last cells unheld (CI,
    // stop 22). So the owner is frozen as soon as the new keeper is seen in /proc.
    for (let attempt = 0; attempt < 2; attempt++) {
      const o = await owner(1500);
      await o.say("fill 15000");
      const last = await o.spawnCell(); // held after the 15,000: beyond what the arguments carry
      const next = freezeOwnerAtNewKeeper(o, o.keeper);
      await until(`attempt ${attempt}: the first and the last cell killed by the new keeper`, () => !alive(o.cell) && !alive(last), 30_000);
      assert.deepEqual(keepers(o.label), [next], "exactly one keeper runs");
      o.child.kill("SIGKILL");
    }
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

  for (const how of ["missing", "nul"] as const) {
    it(`a keeper that cannot be started (${how === "missing" ? "the node binary gone: spawn emits an error" : "spawn throws"}) never crashes its owner; once it can, a keeper holds every cell`, async () => {
      const o = await owner(1500);
      await o.say(`break ${how}`);
      process.kill(o.keeper, "SIGKILL");
      // Restarts fail: at once up to 5 in 10 s, then once a second; the owner runs on and answers.
      await until("failed restarts", async () => ((await o.keeperNow()).started >= 6 ? true : undefined), 60_000, 50);
      const second = await o.spawnCell(); // an add with no keeper: tries to start one, fails, no throw
      const tried = (await o.keeperNow()).started;
      await sleep(2500);
      const later = await o.keeperNow();
      assert.ok(later.started - tried <= 4, `restarts while the keeper cannot start: ${later.started - tried} in 2.5 s (once a second expected)`);
      assert.equal(keepers(o.label).length, 0, "no keeper runs while none can be started");
      await o.say("fix");
      const k = await until("a keeper once spawning works again", () => keepers(o.label)[0], 60_000, 20);
      pids.push(k);
      await sleep(500); // it got the deadline and both groups with its first lines
      o.child.kill("SIGSTOP");
      await until("both cells killed by the keeper when the owner freezes", () => !alive(o.cell) && !alive(second), 60_000);
      o.child.kill("SIGKILL");
    });
  }
});
