/**
 * `cairn pause`, `unpause`, `cancel`, `approve`, `deny` and `--require-approval` through the CLI: a
 * real `cairn run` owner (a child process, sqlite) steered by the commands an operator types, and
 * what `status` and `log` show meanwhile. Every bad request gets one sentence and exit 2, and
 * changes nothing.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { spawn } from "node:child_process";
import { cairn, cairnIn, ENTRY, hasStack, ROOT, type CliResult } from "./support.js";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";

const t = tempDir("cairn-cli-steer-");
after(() => t.cleanup());
const data = join(t.dir, "data");

type Op = Record<string, unknown>;
const cmdRound = (revision: number, id: number, argv: string[]): Op[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv } },
];
const concludeRound = (revision: number, id: number, result: "success" | "failure", text: string): Op[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "conclusion", result, text } },
];

/** A work dir and a scripted model file answering `rounds` (round i tests revision i). */
function scenario(name: string, rounds: Op[][]): { work: string; model: string } {
  const work = join(t.dir, name);
  mkdirSync(work, { recursive: true });
  const model = join(t.dir, `${name}.json`);
  writeFileSync(model, JSON.stringify({ rounds: rounds.map((patch) => ({ patch })) }));
  return { work, model };
}

/** `cairn ARGS --db DB --data-dir DATA`, in this process. */
const steer = (db: string, args: string[]): Promise<CliResult> => cairnIn([...args, "--db", db, "--data-dir", data]);

interface RunView {
  status: string;
  paused: { reason: string; now: boolean } | null;
  awaiting_approval: { cell_id: number; rule: string }[];
  approval_rules: string[];
}
async function run(db: string): Promise<RunView | undefined> {
  const r = await steer(db, ["status", "--json"]);
  if (r.code !== 0) return undefined;
  return (JSON.parse(r.stdout) as { sessions: RunView[] }).sessions[0];
}

const lines = (file: string): number => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0);

describe("cairn approve and deny: a cell matching --require-approval waits for a person", () => {
  it("nothing runs before approval; status and log show the wait; a wrong cell is refused; approve lets it run once", async () => {
    const { work, model } = scenario("approve", [cmdRound(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludeRound(1, 2, "success", "ran it")]);
    const owner = cairn(["run", "append a line", "--db", "ap", "--data-dir", data, "--cwd", work, "--model", `scripted:${model}`, "--require-approval", "argv:sh -c"]);
    const waiting = await until("cell 1 to wait for approval", async () => ((await run("ap"))?.status === "awaiting_approval" ? run("ap") : undefined));
    assert.deepEqual(waiting!.awaiting_approval.map((a) => [a.cell_id, a.rule]), [[1, "argv:sh -c"]]);
    assert.deepEqual(waiting!.approval_rules, ["argv:sh -c"]);
    assert.equal(lines(join(work, "effect.txt")), 0, "nothing ran before approval");

    const text = await steer("ap", ["status"]);
    assert.match(text.stdout, /WAITS FOR APPROVAL: cell 1 since .* \(rule argv:sh -c\): sh -c echo ran >> effect\.txt; `cairn approve --db ap --session s1 --cell 1`/);
    const log = await steer("ap", ["log"]);
    assert.match(log.stdout, /waits for approval \(rule argv:sh -c\)/);

    const noReason = await steer("ap", ["deny", "--session", "s1", "--cell", "1"]);
    assert.equal(noReason.code, 2);
    assert.match(noReason.stderr, /--reason is required: the model is told why/);
    const wrongCell = await steer("ap", ["approve", "--session", "s1", "--cell", "7"]);
    assert.equal(wrongCell.code, 2, wrongCell.stdout + wrongCell.stderr);
    assert.match(wrongCell.stderr, /cell 7/);
    assert.equal(hasStack(wrongCell.stderr), false);
    assert.equal((await run("ap"))!.status, "awaiting_approval", "a refused request changed nothing");

    const ok = await steer("ap", ["approve", "--session", "s1", "--cell", "1", "--reason", "checked", "--json"]);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((JSON.parse(ok.stdout) as { status: string }).status, "applied");
    const done = await owner;
    assert.equal(done.code, 0, done.stderr + done.stdout);
    assert.match(done.stdout, /\[cell 1\] approved: checked/);
    assert.equal(lines(join(work, "effect.txt")), 1, "ran exactly once");
    const after = await steer("ap", ["log"]);
    assert.match(after.stdout, /approved by a person: checked/);
    const late = await steer("ap", ["approve", "--session", "s1", "--cell", "1"]);
    assert.equal(late.code, 2, "the run has ended: nothing to approve");
  });

  it("deny: the cell never runs and the model reads why, then acts on it", async () => {
    const { work, model } = scenario("deny", [cmdRound(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludeRound(1, 2, "failure", "denied: not on this host")]);
    const owner = cairn(["run", "append a line", "--db", "dn", "--data-dir", data, "--cwd", work, "--model", `scripted:${model}`, "--require-approval", "all"]);
    await until("cell 1 to wait for approval", async () => (await run("dn"))?.status === "awaiting_approval");
    const denied = await steer("dn", ["deny", "--session", "s1", "--cell", "1", "--reason", "not on this host"]);
    assert.equal(denied.code, 0, denied.stderr);
    const done = await owner;
    assert.equal(done.code, 1, done.stderr + done.stdout);
    assert.match(done.stdout, /run s1 failed: the model concluded failure: denied: not on this host/);
    assert.equal(lines(join(work, "effect.txt")), 0, "never ran");
    const json = await steer("dn", ["log", "--json"]);
    const events = json.stdout.trim().split("\n").map((l) => JSON.parse(l) as { kind: string; body: Record<string, unknown> });
    const obs = events.find((e) => e.kind === "inbox_received" && (e.body.observation as { id: string }).id === "execution:1");
    assert.equal((obs!.body.observation as { kind: string }).kind, "execution_denied");
    assert.match(JSON.stringify(obs!.body.observation), /not on this host/);
    assert.equal(events.filter((e) => e.kind === "execution_started").length, 0);
  });
});

describe("a worker's own rule: cairn resume --require-approval", () => {
  it("gates the cells of a run submitted without a rule; the run's status names the worker's rule", async () => {
    const { work, model } = scenario("worker-rule", [cmdRound(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludeRound(1, 2, "success", "ran it")]);
    const submitted = await steer("wr", ["submit", "append a line", "--session", "job1"]);
    assert.equal(submitted.code, 0, submitted.stderr);
    // A submitted run executes where its worker runs.
    const owner = cairn(["resume", "--db", "wr", "--data-dir", data, "--model", `scripted:${model}`, "--require-approval", "glob:sh -c *effect*"], { cwd: work });
    const waiting = await until("cell 1 to wait for approval", async () => ((await run("wr"))?.status === "awaiting_approval" ? run("wr") : undefined));
    assert.deepEqual(waiting!.awaiting_approval.map((a) => [a.cell_id, a.rule]), [[1, "glob:sh -c *effect*"]]);
    assert.deepEqual(waiting!.approval_rules, [], "the run itself has no rule: the worker's holds the cell");
    assert.equal(lines(join(work, "effect.txt")), 0);
    const ok = await steer("wr", ["approve", "--session", "job1", "--cell", "1"]);
    assert.equal(ok.code, 0, ok.stderr);
    const done = await owner;
    assert.equal(done.code, 0, done.stderr + done.stdout);
    assert.equal(lines(join(work, "effect.txt")), 1);
  });
});

describe("cairn serve --require-approval: a worker's rule, and what its /metrics shows", () => {
  it("a submitted run's cell waits, paused and approved: the gauges and the counter follow", async () => {
    const { work, model } = scenario("serve", [cmdRound(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludeRound(1, 2, "success", "ran it")]);
    const serve = spawn(process.execPath, ["--import", "tsx", ENTRY, "serve", "--db", "sv", "--data-dir", data, "--model", `scripted:${model}`, "--create", "--cwd", work, "--listen", "127.0.0.1:0", "--log-level", "info", "--require-approval", "script", "--require-approval", "argv:sh"], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    serve.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => serve.on("close", (code) => resolve(code)));
    try {
      const url = await until("the metrics URL", () => /metrics on (http:\/\/[^\s]+)\/metrics/.exec(stderr)?.[1]);
      const metric = async (name: string): Promise<number> => {
        const text = await (await fetch(`${url}/metrics`)).text();
        const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
        return line === undefined ? Number.NaN : Number(line.slice(line.lastIndexOf(" ") + 1));
      };
      const submitted = await steer("sv", ["submit", "append a line", "--session", "job1"]);
      assert.equal(submitted.code, 0, submitted.stderr);
      const waiting = await until("cell 1 to wait for approval", async () => ((await run("sv"))?.status === "awaiting_approval" ? run("sv") : undefined));
      assert.deepEqual(waiting!.awaiting_approval.map((a) => [a.cell_id, a.rule]), [[1, "argv:sh"]]);
      assert.equal(await metric("cairn_approvals_waiting"), 1);
      assert.ok((await metric("cairn_approval_oldest_wait_seconds")) >= 0);

      const paused = await steer("sv", ["pause", "--session", "job1", "--json"]);
      assert.equal((JSON.parse(paused.stdout) as { status: string }).status, "applied", paused.stdout + paused.stderr);
      assert.equal(await metric("cairn_runs_paused"), 1);
      const approved = await steer("sv", ["approve", "--session", "job1", "--cell", "1", "--json"]);
      assert.equal((JSON.parse(approved.stdout) as { status: string }).status, "applied", approved.stdout + approved.stderr);
      assert.equal(await metric("cairn_approvals_waiting"), 0);
      assert.equal(await metric("cairn_approval_oldest_wait_seconds"), 0);
      assert.equal(lines(join(work, "effect.txt")), 0, "approved but paused: not launched");
      await steer("sv", ["unpause", "--session", "job1"]);
      await until("the run to end", async () => (await run("sv"))?.status === "success");
      assert.equal(lines(join(work, "effect.txt")), 1);
      assert.equal(await metric("cairn_runs_paused"), 0);
      const text = await (await fetch(`${url}/metrics`)).text();
      for (const action of ["pause", "approve", "unpause"]) assert.match(text, new RegExp(`cairn_operator_requests_total\\{[^}]*action="${action}"[^}]*\\} 1\\b`));
    } finally {
      serve.kill("SIGTERM");
      await exited;
    }
  });
});

describe("cairn pause, unpause, cancel", () => {
  it("pause shows everywhere and lets the running cell finish; cancel ends the run as cancelled; a second cancel is already done; requests to an ended run are refused", async () => {
    const gate = ["sh", "-c", "echo ran >> effect.txt; i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo done >> effect.txt"];
    const second = ["sh", "-c", "echo second >> second.txt"];
    const { work, model } = scenario("pause", [[...cmdRound(0, 1, gate), { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "cmd", argv: second } }], concludeRound(1, 3, "success", "unexpected")]);
    const owner = cairn(["run", "run two cells", "--db", "pc", "--data-dir", data, "--cwd", work, "--model", `scripted:${model}`, "--validator", "sh -c 'echo validated >> validated.txt'"]);
    await until("cell 1 to run", () => lines(join(work, "effect.txt")) === 1);

    const paused = await steer("pc", ["pause", "--session", "s1", "--reason", "look first"]);
    assert.equal(paused.code, 0, paused.stderr);
    assert.match(paused.stdout, /pause of run s1: done/);
    const view = await run("pc");
    assert.equal(view!.status, "paused");
    assert.deepEqual(view!.paused, { reason: "look first", at: (view!.paused as { at?: string }).at, now: false });
    assert.match((await steer("pc", ["status"])).stdout, /PAUSED since .*: look first; `cairn unpause --db pc --session s1` lets it go on/);
    assert.match((await steer("pc", ["log"])).stdout, /paused by an operator, the running cell finishes: look first/);

    writeFileSync(join(work, "release"), "");
    await until("cell 1 to finish", () => lines(join(work, "effect.txt")) === 2);
    await until("cell 1's result to be recorded", async () => (await steer("pc", ["log", "--json"])).stdout.includes('"execution_finished"'));
    assert.equal((await run("pc"))!.status, "paused");

    const again = await steer("pc", ["pause", "--session", "s1"]);
    assert.equal(again.code, 0, again.stderr);
    const cancelled = await steer("pc", ["cancel", "--session", "s1", "--reason", "wrong task"]);
    assert.equal(cancelled.code, 0, cancelled.stderr);
    const done = await owner;
    assert.equal(done.code, 1, done.stderr + done.stdout);
    assert.match(done.stdout, /run s1 was cancelled: cancelled by an operator: wrong task/);
    assert.equal(existsSync(join(work, "second.txt")), false, "the queued cell never ran");
    assert.equal(existsSync(join(work, "validated.txt")), false, "validators do not run on a cancel");
    const end = await run("pc");
    assert.equal(end!.status, "cancelled");
    const events = (await steer("pc", ["log", "--json"])).stdout.trim().split("\n").map((l) => JSON.parse(l) as { kind: string; body: { cell_id?: number; result?: string } });
    assert.deepEqual(events.filter((e) => e.kind === "execution_started").map((e) => e.body.cell_id), [1], "the queued cell never started: not while paused, not after the cancel");
    assert.deepEqual(events.filter((e) => e.kind === "execution_finished").map((e) => [e.body.cell_id, e.body.result]), [[1, "success"], [2, "cancelled"]]);
    assert.equal(events.filter((e) => e.kind === "validator_result").length, 0);

    const twice = await steer("pc", ["cancel", "--session", "s1"]);
    assert.equal(twice.code, 0, twice.stderr);
    assert.match(twice.stdout, /already cancelled/);
    const unpause = await steer("pc", ["unpause", "--session", "s1"]);
    assert.equal(unpause.code, 2, "an ended run cannot be unpaused");
    assert.match(unpause.stderr, /has ended/);
  });
});

describe("steering commands: bad requests get one sentence and exit 2", () => {
  const cases: [string, string[], RegExp][] = [
    ["--now on cancel", ["cancel", "--session", "s1", "--now"], /--now belongs to cairn pause/],
    ["--cell on pause", ["pause", "--session", "s1", "--cell", "1"], /--cell belongs to cairn approve and cairn deny/],
    ["approve without --cell", ["approve", "--session", "s1"], /--cell is required/],
    ["a bad --cell", ["approve", "--session", "s1", "--cell", "x"], /--cell/],
    ["no --session", ["pause"], /--session/],
    ["an unknown run", ["pause", "--session", "nope"], /run "nope" does not exist/],
    ["a bad --id", ["pause", "--session", "s1", "--id", "a b"], /--id: the request id "a b" is not valid/],
    ["a stray argument", ["deny", "--session", "s1", "--cell", "1", "not", "quoted"], /takes no arguments besides flags.*quote --reason/],
  ];
  for (const [what, args, message] of cases) {
    it(what, async () => {
      const r = await steer("pc", args);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
      assert.equal(hasStack(r.stderr), false);
    });
  }

  it("a bad --require-approval rule names the flag", async () => {
    const r = await cairnIn(["run", "g", "--db", "bad", "--data-dir", data, "--model", "scripted:/nonexistent.json", "--require-approval", "argv:"]);
    assert.equal(r.code, 2, r.stdout + r.stderr);
    assert.match(r.stderr, /--require-approval/);
  });

  it("post cannot use a cairn. kind (operators' requests go through their own commands)", async () => {
    const r = await steer("pc", ["post", "--session", "s1", "--id", "x", "--kind", "cairn.steer", "--payload", '{"action":"cancel","reason":""}']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /reserved for Cairn's own requests/);
  });

  it("each command's --help documents it", async () => {
    for (const c of ["pause", "unpause", "cancel", "approve", "deny"]) {
      const r = await cairnIn([c, "--help"]);
      assert.equal(r.code, 0);
      assert.match(r.stdout, new RegExp(`usage: cairn ${c} --db NAME --session ID`));
    }
  });
});
