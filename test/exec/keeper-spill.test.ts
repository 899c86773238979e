/**
 * Review of the cell keeper's spill file (src/exec/keeper.ts, spill): past 4,000 groups an owner
 * writes the rest into an unlinked temp file handed to the new keeper as its fd 3. Checked here with
 * real processes: no descriptor leaks in the owner across many restarts, no file left in the temp
 * directory, the keeper closes its fd 3 after reading it, a keeper started while the owner is frozen
 * at once holds every group (also after many restarts), and a temp directory where no file can be
 * created never crashes the owner: the keeper starts with the arguments' groups and gets the rest
 * through the pipe.
 */
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { sleep, until } from "../support/wait.js";
import { alive, keepers, freezeOwnerAtNewKeeper, killOwners, pids, procFields, startOwner } from "./keeper-owner.js";

/** The targets of `pid`'s descriptors (null for a process that is gone). */
function fdTargets(pid: number): string[] | null {
  try {
    return readdirSync(`/proc/${pid}/fd`).map((fd) => {
      try {
        return readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        return "";
      }
    });
  } catch {
    return null;
  }
}

/** Files a keeper's spill could leave in `dir` (tsx keeps its own cache there too). */
const spillFiles = (dir: string): string[] => readdirSync(dir).filter((f) => f.startsWith("cairn-keeper-"));

const root = mkdtempSync(join(tmpdir(), "cairn-spill-review-"));
after(() => {
  killOwners();
  rmSync(root, { recursive: true, force: true });
});

/** An owner whose keeper is labelled kspill-PID-N, with TMPDIR `tmp` (where its spill files go). */
const owner = (remainingMs: number, tmp: string) => startOwner(remainingMs, "kspill", { TMPDIR: tmp });

/** Kills the current keeper and waits for its replacement (any start delay: up to 60 s). */
async function killKeeper(o: Awaited<ReturnType<typeof owner>>, current: number): Promise<number> {
  process.kill(current, "SIGKILL");
  const next = await until("the next keeper", () => keepers(o.label).find((pid) => pid !== current), 60_000, 10).catch(async (err: Error) => {
    const k = await o.keeperNow();
    throw new Error(`${err.message}: owner says keeper ${k.pid} started ${k.started}; alive ${alive(k.pid)}; cmdline ${readFileSync(`/proc/${k.pid}/cmdline`, "utf8").slice(0, 200)}`);
  });
  pids.push(next);
  return next;
}

describe("cell keeper spill file (review)", () => {
  it("12 restarts holding 6,000 groups: no descriptor leak in the owner, no file left in TMPDIR, each keeper closes its fd 3", async () => {
    const tmp = mkdtempSync(join(root, "t-"));
    const o = await owner(60_000, tmp);
    await o.say("fill 6000");
    let current = await killKeeper(o, o.keeper); // the first keeper with a spill file
    const base = await o.fds();
    assert.equal(base.spills, 0, "the owner holds a descriptor of a spill file after spawn");
    for (let i = 0; i < 12; i++) {
      // the keeper read its fd 3 and closed it (it only holds its pipe, /dev/null and Node's own)
      const k = current;
      await until(`keeper ${k} to close its fd 3 spill file`, () => {
        const t = fdTargets(k);
        return t !== null && !t.some((x) => x.includes("cairn-keeper-")) && (procFields(k)?.[0] ?? "Z") !== "Z";
      }, 30_000, 20);
      current = await killKeeper(o, current);
    }
    await sleep(500);
    const end = await o.fds();
    assert.equal(end.spills, 0, "a spill file descriptor stays open in the owner");
    // a leak would be one descriptor per restart (12); Node's own can vary by a few
    assert.ok(end.count - base.count < 6, `owner descriptors grew from ${base.count} to ${end.count} over 12 restarts`);
    assert.deepEqual(spillFiles(tmp), [], "files left in the owner's TMPDIR");
    assert.deepEqual(keepers(o.label), [current], "exactly one keeper runs");
    o.child.kill("SIGKILL");
  });

  it("killed 8 times (past the at-once restart limit) while holding 9,000 groups, the owner frozen the moment the last keeper appears: that keeper holds the first and the last group", async () => {
    const tmp = mkdtempSync(join(root, "t-"));
    const o = await owner(1500, tmp);
    await o.say("fill 9000");
    const last = await o.spawnCell(); // held after the 9,000: in the spill file
    let current = o.keeper;
    for (let i = 0; i < 7; i++) current = await killKeeper(o, current);
    // the 8th: freeze the owner as soon as the new keeper exists (it cannot have written it anything)
    freezeOwnerAtNewKeeper(o, current);
    await until("the first (argv) and the last (spill file) cell killed by the new keeper", () => !alive(o.cell) && !alive(last), 45_000);
    assert.deepEqual(spillFiles(tmp), [], "files left in the owner's TMPDIR");
    o.child.kill("SIGKILL");
  });

  it("many groups across an argv/spill boundary (exactly 4,000 and 4,001 held): the keeper holds both cells", async () => {
    for (const fill of [3999, 4000]) {
      // cells: the first (argv), then `fill` fake groups, then one more: the 4,000th or 4,001st entry held
      const tmp = mkdtempSync(join(root, "t-"));
      const o = await owner(1500, tmp);
      await o.say(`fill ${fill - 1}`);
      const edge = await o.spawnCell(); // entry number fill + 1
      freezeOwnerAtNewKeeper(o, o.keeper);
      await until(`with ${fill + 1} groups: both cells killed`, () => !alive(o.cell) && !alive(edge), 45_000);
      o.child.kill("SIGKILL");
    }
  });

  for (const how of ["missing", "file", "proc"] as const) {
    it(`TMPDIR where no file can be created (${how}): the owner never crashes, a keeper still starts and holds every group (the rest through the pipe), no file appears`, async () => {
      const tmp = mkdtempSync(join(root, "t-"));
      const o = await owner(1500, tmp);
      const bad = how === "missing" ? join(root, "no", "such", "dir") : how === "proc" ? "/proc" : join(tmp, "a-file");
      if (how === "file") writeFileSync(bad, "x");
      await o.say(`tmpdir ${bad}`);
      // Below 4,000 groups nothing is spilled: a keeper starts with a bad TMPDIR.
      const k2 = await killKeeper(o, o.keeper);
      assert.ok(alive(k2));
      await o.say("fill 5000");
      const last = await o.spawnCell(); // past the arguments' 4,000: through the pipe, since no file can be written
      process.kill(k2, "SIGKILL");
      const k3 = await until("a keeper started in spite of the bad TMPDIR", async () => {
        const now = await o.keeperNow();
        return now.started === 3 && alive(now.pid) ? now.pid : undefined;
      }, 60_000, 20);
      pids.push(k3);
      await sleep(2500);
      assert.equal((await o.keeperNow()).started, 3, "keepers restarted although the one started with the pipe fallback runs");
      assert.deepEqual(keepers(o.label), [k3]);
      assert.equal(o.crashed(), undefined, "the owner crashed");
      const fds = await o.fds();
      assert.equal(fds.spills, 0);
      o.child.kill("SIGSTOP");
      await until("the first cell (arguments) and the last (pipe) killed by the keeper when the owner freezes", () => !alive(o.cell) && !alive(last), 60_000);
      assert.deepEqual(spillFiles(tmp), [], "files left in TMPDIR");
      o.child.kill("SIGKILL");
    });
  }

  // Found in review (fixed): with more than 4,000 groups and a TMPDIR where no file can be created
  // (full disk, missing directory), every start failed in spill, so NO keeper ran at all: even the
  // 4,000 groups that fit in the arguments were unguarded, and a frozen owner's cells ran past the
  // lease. Now the keeper starts with the arguments' groups and gets the rest through the pipe.
  it("TMPDIR unusable while holding over 4,000 groups, owner frozen: the cells that fit in argv are still killed at the deadline", async () => {
    const tmp = mkdtempSync(join(root, "t-"));
    const o = await owner(1500, tmp);
    await o.say(`tmpdir ${join(root, "missing-dir")}`);
    await o.say("fill 5000");
    process.kill(o.keeper, "SIGKILL");
    await until("a failed restart", async () => ((await o.keeperNow()).started >= 2 ? true : undefined), 60_000, 50);
    o.child.kill("SIGSTOP");
    const killed = await until("the first cell killed", () => !alive(o.cell), 12_000).then(() => true, () => false);
    o.child.kill("SIGKILL");
    assert.ok(killed, `the first cell (${o.cell}, in the arguments' part) still runs 12 s after its frozen owner's 1.5 s deadline: no keeper was started (keepers: ${keepers(o.label).length})`);
  });

  it("the owner's own fd 3 is not what the keeper reads: with no spill (under 4,000 groups) the keeper has no fd 3 file, and holds its cells", async () => {
    const tmp = mkdtempSync(join(root, "t-"));
    const o = await owner(1500, tmp);
    const second = await o.spawnCell();
    const k = await killKeeper(o, o.keeper);
    const t = fdTargets(k) ?? [];
    assert.ok(!t.some((x) => x.includes("cairn-keeper-")), `keeper fds: ${t.join(", ")}`);
    await sleep(500);
    o.child.kill("SIGSTOP");
    await until("both cells killed", () => !alive(o.cell) && !alive(second), 60_000);
    o.child.kill("SIGKILL");
  });
});
