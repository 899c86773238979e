/**
 * Failover on the replicated adapter, end to end through the `cairn` command and a real three-member
 * etcd cluster: machines are simulated by processes with separate data directories.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";
import { cairn, ENTRY, ROOT } from "../cli/support.js";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";

const t = tempDir("cairn-failover-");
let cluster: DevCluster;
const children: ChildProcess[] = [];

before(async () => {
  cluster = await startDevCluster({ dir: join(t.dir, "cluster") });
});
after(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await cluster?.stop();
  t.cleanup();
});

const op = (revision: number) => ({ op: "test", path: "/revision", value: revision });
const add = (value: Record<string, unknown>) => ({ op: "add", path: "/cells/-", value });

function spawnCairn(args: string[]): { child: ChildProcess; out: () => string; err: () => string; exit: Promise<{ code: number | null; signal: string | null }> } {
  const child = spawn(process.execPath, ["--import", "tsx", ENTRY, ...args], { cwd: ROOT, env: { ...process.env, CAIRN_ETCD_ENDPOINTS: cluster.endpoints.join(",") }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exit = new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on("close", (code, signal) => resolve({ code, signal })));
  return { child, out: () => out, err: () => err, exit };
}


describe("replicated storage: a run survives the loss of its machine and of members", () => {
  it("B takes over a run from A (empty data dir), A exits 3, B reports UnknownExecution and finishes", async () => {
    const work = join(t.dir, "work1");
    const effect = join(work, "effect.txt");
    const script = join(t.dir, "takeover.json");
    writeFileSync(
      script,
      JSON.stringify({
        rounds: [
          { patch: [op(0), add({ id: 1, previous_id: null, kind: "cmd", argv: ["sh", "-c", `mkdir -p ${work}; echo started >> ${effect}; sleep 60; echo finished >> ${effect}`] })] },
          { patch: [op(1), add({ id: 2, previous_id: null, kind: "cmd", argv: ["cat", effect] })] },
          {
            patch: [
              op(2),
              add({ id: 3, previous_id: null, kind: "note", role: "resolution", target_cell_id: 1, evidence_refs: ["cell:2"], text: "cell 1 started but never finished; the effect file shows one start and no finish" }),
              add({ id: 4, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "investigated the interrupted cell" }),
            ],
          },
        ],
      }),
    );
    const dataA = join(t.dir, "machine-a");
    const dataB = join(t.dir, "machine-b");
    const common = ["--db", "harness-1", "--storage", "replicated", "--model", `scripted:${script}`];
    const a = spawnCairn(["run", "survive a lost machine", ...common, "--data-dir", dataA, "--cwd", t.dir, "--json"]);
    await until("A's cell to start", () => existsSync(effect) && readFileSync(effect, "utf8").includes("started"));
    assert.equal(existsSync(dataB), false, "B's data directory starts empty");

    const b = spawnCairn(["resume", ...common, "--data-dir", dataB, "--json"]);
    const aExit = await a.exit;
    assert.equal(aExit.code, 3, `A exits 3 when fenced: ${a.err()}`);
    assert.match(a.err(), /fenced/);
    const bExit = await b.exit;
    assert.equal(bExit.code, 0, `B finishes the run: ${b.err()}`);

    const events = b.out().trim().split("\n").map((l) => JSON.parse(l));
    const unknown = events.find((e) => e.kind === "execution_finished" && e.body.cell_id === 1);
    assert.equal(unknown?.body.result, "UnknownExecution");
    assert.equal(unknown?.body.unknown.reason, "worker_lost_before_result_commit");
    const consumed = events.filter((e) => e.kind === "patch_accepted").flatMap((e) => e.body.consumed);
    assert.ok(consumed.includes("execution:1"), "the model was given the UnknownExecution");
    assert.equal(events.at(-1).kind, "run_ended");
    assert.equal(events.at(-1).body.result, "success");
    assert.equal(readFileSync(effect, "utf8"), "started\n", "cell 1 ran once and was stopped; nothing re-ran it");
    assert.equal(events.filter((e) => e.kind === "execution_started" && e.body.cell_id === 1).length, 0, "B never started cell 1 again");

    // Everything A resolved is in B's copy: A's session, turn and started events are in the log B read.
    const status = await cairn(["status", "--db", "harness-1", "--storage", "replicated", "--data-dir", join(t.dir, "observer"), "--json"], { env: { CAIRN_ETCD_ENDPOINTS: cluster.endpoints.join(",") } });
    const s = JSON.parse(status.stdout).sessions[0];
    assert.equal(s.status, "success");
    assert.deepEqual(s.executions.map((e: { cell_id: number; result: string }) => [e.cell_id, e.result]), [[1, "UnknownExecution"], [2, "success"]]);
  });

  it("a member killed mid-run changes nothing; with two down, commits wait, then resolve once one is back", async () => {
    const work = join(t.dir, "work2");
    const gate = join(t.dir, "gate");
    const script = join(t.dir, "members.json");
    writeFileSync(
      script,
      JSON.stringify({
        rounds: [
          { patch: [op(0), add({ id: 1, previous_id: null, kind: "cmd", argv: ["sh", "-c", `mkdir -p ${work}; touch ${gate}.1; while [ ! -e ${gate}.go1 ]; do sleep 0.1; done; echo one`] })] },
          { patch: [op(1), add({ id: 2, previous_id: null, kind: "cmd", argv: ["sh", "-c", `touch ${gate}.2; while [ ! -e ${gate}.go2 ]; do sleep 0.1; done; echo two`] })] },
          { patch: [op(2), add({ id: 3, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "both ran" })] },
        ],
      }),
    );
    // A lease longer than the outage below: with the default (3 s) the owner would stop its cells and
    // exit 4 once it cannot renew (chaos/silent-zone.test.ts); here it rides the outage out.
    const run = spawnCairn(["run", "survive member loss", "--db", "harness-2", "--storage", "replicated", "--liveness", "120", "--model", `scripted:${script}`, "--data-dir", join(t.dir, "m2"), "--cwd", t.dir, "--json"]);
    await until("cell 1 to run", () => existsSync(`${gate}.1`));
    await cluster.kill(2);
    writeFileSync(`${gate}.go1`, "");
    await until("cell 2 to run with one member down", () => existsSync(`${gate}.2`));

    // Two down: no quorum. The result of cell 2 cannot commit; the run waits.
    await cluster.kill(1);
    writeFileSync(`${gate}.go2`, "");
    await new Promise((r) => setTimeout(r, 3000));
    assert.equal(run.child.exitCode, null, "the run waits for the quorum instead of failing");
    const before = run.out().trim().split("\n").map((l) => JSON.parse(l));
    assert.equal(before.some((e) => e.kind === "execution_finished" && e.body.cell_id === 2), false, "nothing resolved without a quorum");

    await cluster.restart(1);
    const exit = await run.exit;
    assert.equal(exit.code, 0, run.err());
    const events = run.out().trim().split("\n").map((l) => JSON.parse(l));
    const two = events.find((e) => e.kind === "execution_finished" && e.body.cell_id === 2);
    assert.equal(two?.body.result, "success");
    assert.equal(events.at(-1).body.result, "success");
    // Nothing acknowledged was lost: every event the run printed (each resolved) is in the cluster.
    await cluster.restart(2);
    const status = await cairn(["status", "--db", "harness-2", "--storage", "replicated", "--data-dir", join(t.dir, "observer2"), "--json"], { env: { CAIRN_ETCD_ENDPOINTS: cluster.endpoints.join(",") } });
    assert.equal(JSON.parse(status.stdout).head, events.at(-1).seq);
  });
});
