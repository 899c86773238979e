/**
 * The cell keeper wired into a real owner: a harness process on sqlite (with its liveness lease)
 * launches a long cell, and is then frozen with SIGSTOP, so it cannot stop the cell itself when its
 * lease runs out. The cell must die anyway, while the owner is still frozen: the harness handed the
 * cell's process group to its keeper (src/harness/lease.ts), which kills it at the lease deadline.
 * Without that wiring the cell would run its full 600 s.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { until } from "../support/wait.js";

const src = (p: string) => JSON.stringify(pathToFileURL(new URL(`../../${p}`, import.meta.url).pathname).href);

/** Opens database "k" under argv[1], starts a run whose one cell sleeps 600 s, prints "started PID". */
const OWNER = `
import { Harness } from ${src("src/harness/harness.ts")};
import { ScriptedModel } from ${src("src/model/scripted.ts")};
import { createSqliteStorage } from ${src("storage-adapters/sqlite/index.ts")};
const dir = process.argv[1];
const model = new ScriptedModel({ rounds: [{ patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["sleep", "600"] } }] }] });
const h = await Harness.open({ storage: createSqliteStorage({ dataDir: dir + "/db" }), name: "k", model, workDir: dir + "/work" });
h.follow((events) => { for (const e of events) if (e.kind === "execution_started") console.log("started " + e.body.pid); });
await h.start({ goal: "sleep", cwd: dir });
setInterval(() => {}, 1000);
`;

/** Running (a zombie is not: a killed cell of a frozen owner stays one until its parent reaps it). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat[stat.lastIndexOf(")") + 2] !== "Z";
  } catch {
    return false;
  }
}

const dir = mkdtempSync(join(tmpdir(), "cairn-keeper-owner-"));
let owner: ChildProcess | null = null;
let cell = 0;

after(() => {
  owner?.kill("SIGKILL");
  if (cell > 1) {
    try {
      process.kill(-cell, "SIGKILL");
    } catch {
      // gone
    }
  }
  rmSync(dir, { recursive: true, force: true });
});

describe("an owner frozen while its cell runs", () => {
  it("its cell is killed at the lease deadline, while the owner is still frozen", async () => {
    owner = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", OWNER, dir], { stdio: ["ignore", "pipe", "inherit"] });
    const lines: string[] = [];
    createInterface({ input: owner.stdout! }).on("line", (l) => lines.push(l));
    const line = await until("the cell to start", () => lines.find((l) => l.startsWith("started ")), 120_000);
    cell = Number(line.split(" ")[1]);
    assert.ok(running(cell), "the cell runs");
    owner.kill("SIGSTOP");
    const frozenAt = Date.now();
    await until("the frozen owner's cell to be killed", () => !running(cell), 60_000);
    assert.ok(readFileSync(`/proc/${owner.pid}/stat`, "utf8").includes(") T "), "the owner is still frozen (state T)");
    process.stdout.write(`# the frozen owner's cell died ${Date.now() - frozenAt} ms after the freeze (sqlite lease 3 s)\n`);
  });
});
