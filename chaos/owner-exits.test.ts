/**
 * How an owner that is not the owner any more ends, with real `cairn` processes (sqlite): always
 * exit 3 with the fenced line, never 4 ("storage unavailable") and never 5 ("a bug").
 *
 * - Two openers that take the database by force at the same moment (`cairn serve --takeover` twice;
 *   `cairn resume` twice against a busy `cairn run`), many times: each time one keeps it, and every
 *   process it took the database from exits 3 and says another process owns the database now.
 *
 * The frozen owner (SIGSTOP, takeover, SIGCONT: exit 3) is in chaos/sched.test.ts; an outage longer
 * than the lease (exit 4) in chaos/quorum-exit.test.ts.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { cleanupProcesses, describe as said, runCairn, startCairn, type CliProcess, type CliResult } from "./support/cli.js";
import { cmdPatch, concludePatch, writeScript } from "./support/patches.js";
import { until } from "./support/procs.js";

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-owner-exits-"));
after(() => {
  cleanupProcesses();
  rmSync(root, { recursive: true, force: true });
});

const ROUNDS = Number(process.env.CAIRN_OWNER_RACES ?? 6);
const LEASE_MS = 2000;
const FENCED = /cairn: fenced: another process owns database "w" now/;

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

async function readyz(port: number): Promise<number | undefined> {
  try {
    return (await fetch(`http://127.0.0.1:${port}/readyz`)).status;
  } catch {
    return undefined;
  }
}

/** Whichever of `procs` ends first, with its index (a hang guard: `limitMs`). */
async function firstEnded(procs: readonly CliProcess[], limitMs = 120_000): Promise<{ i: number; r: CliResult }> {
  let timer: NodeJS.Timeout | undefined;
  const guard = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error("hang guard: no opener ended")), limitMs);
  });
  try {
    return await Promise.race([...procs.map((p, i) => p.result.then((r) => ({ i, r }))), guard]);
  } finally {
    clearTimeout(timer);
  }
}

describe("a process that loses a race for a database exits 3, fenced", () => {
  test(`two \`cairn serve --takeover\` started together, ${ROUNDS} times: one keeps the database, the other exits 3 with the fenced line`, async () => {
    const dir = join(root, "serve");
    const data = join(dir, "data");
    const work = join(dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(dir, "model.json");
    writeScript(model, [concludePatch(0, 1, "success", "done")]);
    const created = await runCairn(["run", "create it", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--cwd", work]);
    assert.equal(created.code, 0, said(created));
    for (let round = 0; round < ROUNDS; round++) {
      const ports = [await freePort(), await freePort()];
      const procs = ports.map((port) =>
        startCairn(["serve", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${port}`, "--takeover", "--lease", `${LEASE_MS / 1000}s`, "--fenced-linger", "1s"], {}, 180_000),
      );
      try {
        const { i, r } = await firstEnded(procs);
        assert.equal(r.code, 3, `round ${round}: ${said(r)}`);
        assert.match(r.stderr, FENCED, `round ${round}: ${said(r)}`);
        const winner = procs[1 - i]!;
        // The other one keeps the database: ready, and still running once the loser is gone.
        for (let t = 0; (await readyz(ports[1 - i]!)) !== 200; t++) {
          assert.ok(t < 600 && winner.child.exitCode === null, `round ${round}: the winner never became ready; it ${winner.child.exitCode === null ? "still runs" : `exited ${winner.child.exitCode}`}`);
          await new Promise((res) => setTimeout(res, 100));
        }
        // ...and keeps it past a few lease lengths: an opener that claimed last but lost the lease
        // would stop by then (it renews every third of the lease).
        await new Promise((res) => setTimeout(res, 3 * LEASE_MS));
        if (winner.child.exitCode !== null) assert.fail(`round ${round}: the winner stopped: ${said(await winner.result)}`);
        assert.equal(await readyz(ports[1 - i]!), 200, `round ${round}: the winner is not ready any more`);
        winner.child.kill("SIGTERM");
        const w = await winner.result;
        assert.equal(w.code, 0, `round ${round}: the winner: ${said(w)}`);
      } finally {
        for (const p of procs) p.child.kill("SIGKILL");
        await Promise.all(procs.map((p) => p.result));
      }
    }
  });

  test(`\`cairn resume\` twice at once against a busy \`cairn run\`, ${ROUNDS} times: the run and every opener that lost exit 3 with the fenced line, none 4 or 5`, async (t) => {
    let fencedOpeners = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const dir = join(root, `resume-${round}`);
      const data = join(dir, "data");
      const work = join(dir, "work");
      mkdirSync(work, { recursive: true });
      const model = join(dir, "model.json");
      // Round 0 keeps the run busy; the resumed run has no round 1 and stops there (its exit is 2).
      writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "touch started; sleep 600"])]);
      const owner = startCairn(["run", "stay busy", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--cwd", work], {}, 300_000);
      const all: CliProcess[] = [owner];
      try {
        await until("the run's cell to start", () => existsSync(join(work, "started")) || undefined, 120_000);
        const pair = [0, 1].map(() => startCairn(["resume", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`], {}, 300_000));
        all.push(...pair);
        const first = await owner.result;
        assert.equal(first.code, 3, `round ${round}: the run: ${said(first)}`);
        assert.match(first.stderr, FENCED, `round ${round}: the run: ${said(first)}`);
        for (const p of pair) {
          const r = await p.result;
          assert.ok(r.code === 2 || r.code === 3, `round ${round}: an opener: ${said(r)}`);
          if (r.code === 3) {
            fencedOpeners++;
            assert.match(r.stderr, FENCED, `round ${round}: ${said(r)}`);
          } else {
            assert.match(r.stderr, /the scripted model has no round 1/, `round ${round}: ${said(r)}`);
          }
        }
      } finally {
        for (const p of all) p.child.kill("SIGKILL");
        await Promise.all(all.map((p) => p.result));
      }
    }
    t.diagnostic(`openers fenced by the other opener: ${fencedOpeners} of ${ROUNDS} races`);
  });
});
