import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { cpSync } from "node:fs";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { cairn, cairnIn, hasStack, ROOT } from "./support.js";
import { tempDir } from "../harness/support.js";

const t = tempDir("cairn-cli-");
after(() => t.cleanup());

function project(): string {
  const dir = join(t.dir, `calc-${Math.random().toString(36).slice(2, 8)}`);
  cpSync(join(ROOT, "examples", "calc"), dir, { recursive: true });
  return dir;
}

const demoArgs = (db: string, cwd: string) => [
  "run",
  "Make the tests in this project pass",
  "--db",
  db,
  "--data-dir",
  join(t.dir, "data"),
  "--cwd",
  cwd,
  "--model",
  `scripted:${join(ROOT, "examples", "fix-calc.json")}`,
  "--validator",
  "python3 -m unittest discover -s tests -q",
];

describe("cairn run: the demo on the embedded default (sqlite)", () => {
  let cwd = "";
  let result: Awaited<ReturnType<typeof cairn>>;
  before(async () => {
    cwd = project();
    result = await cairn(demoArgs("demo", cwd));
  });

  it("fixes the project and ends in success with exit code 0", () => {
    assert.equal(result.code, 0, result.stderr + result.stdout);
    assert.match(result.stdout, /run s1 succeeded/);
    assert.match(result.stdout, /\[cell 2\] \| def add\(a, b\):/, "the output of the inspecting cell is shown as it arrives");
    assert.match(result.stdout, /\[validator\] `python3 -m unittest discover -s tests -q` passed/);
    execFileSync("python3", ["-m", "unittest", "discover", "-s", "tests", "-q"], { cwd, stdio: "pipe" });
  });

  it("status --json documents the run (cairn.status/1)", async () => {
    const r = await cairnIn(["status", "--db", "demo", "--data-dir", join(t.dir, "data"), "--json"]);
    assert.equal(r.code, 0, r.stderr);
    const s = JSON.parse(r.stdout);
    assert.equal(s.schema, "cairn.status/1");
    assert.equal(s.db, "demo");
    assert.ok(s.head > 10);
    const run = s.sessions[0];
    assert.equal(run.id, "s1");
    assert.equal(run.status, "success");
    assert.equal(run.goal, "Make the tests in this project pass");
    assert.deepEqual(
      run.executions.map((e: { cell_id: number; kind: string; phase: string; result: string }) => [e.cell_id, e.kind, e.phase, e.result]),
      [
        [2, "cmd", "finished", "success"],
        [4, "script", "finished", "success"],
        [5, "cmd", "finished", "success"],
      ],
    );
    assert.deepEqual(run.unresolved_unknown, []);
    assert.equal(run.rounds, 4);
    assert.ok(run.usage.input_tokens > 0);
    assert.deepEqual(run.validators, [["python3", "-m", "unittest", "discover", "-s", "tests", "-q"]]);
    for (const key of ["cells", "inbox", "timers", "budgets", "result", "revision", "cwd", "created_at"]) assert.ok(key in run, `status has ${key}`);
  });

  it("status without --json prints a readable summary, and one session with --session", async () => {
    const r = await cairnIn(["status", "--db", "demo", "--data-dir", join(t.dir, "data"), "--session", "s1"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /run s1: success/);
    assert.match(r.stdout, /cell 5 cmd \[finished: success exit 0\]/);
  });

  it("resume on a database whose runs all ended does nothing and exits 0", async () => {
    const r = await cairnIn(["resume", "--db", "demo", "--data-dir", join(t.dir, "data"), "--model", `scripted:${join(ROOT, "examples", "fix-calc.json")}`]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /nothing to resume/);
  });

  it("--json prints one committed event per line", async () => {
    const r = await cairn([...demoArgs("demo-json", project()), "--json"]);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines[0].kind, "session_created");
    assert.equal(lines.at(-1).kind, "run_ended");
    assert.deepEqual(lines.map((e: { seq: number }) => e.seq), lines.map((_: unknown, i: number) => i + 1));
  });
});

describe("cairn: every bad input gets one sentence and the right exit code", () => {
  const data = () => join(t.dir, "data-bad");
  const cases: { name: string; args: () => string[]; env?: NodeJS.ProcessEnv; code: number; says: RegExp }[] = [
    { name: "unknown command", args: () => ["frobnicate"], code: 2, says: /unknown command "frobnicate"/ },
    { name: "unknown flag", args: () => ["run", "goal", "--db", "x", "--bogus"], code: 2, says: /unknown flag --bogus/ },
    { name: "missing --db", args: () => ["run", "goal", "--model", "scripted:x.json"], code: 2, says: /--db is required/ },
    { name: "bad --db name", args: () => ["status", "--db", "../etc"], code: 2, says: /not a valid name/ },
    { name: "missing goal", args: () => ["run", "--db", "x", "--model", "scripted:x.json"], code: 2, says: /say what the agent should achieve/ },
    { name: "missing --model", args: () => ["run", "goal", "--db", "x", "--data-dir", data()], code: 2, says: /--model is required/ },
    { name: "unreadable scripted file", args: () => ["run", "goal", "--db", "x", "--data-dir", data(), "--model", "scripted:/nonexistent/rounds.json"], code: 2, says: /cannot read the scripted model file \/nonexistent\/rounds.json/ },
    { name: "missing API key", args: () => ["run", "goal", "--db", "x", "--data-dir", data(), "--model", "anthropic/claude-sonnet-4-5"], env: { ANTHROPIC_API_KEY: "" }, code: 2, says: /ANTHROPIC_API_KEY/ },
    { name: "unknown storage", args: () => ["status", "--db", "x", "--storage", "floppy"], code: 2, says: /--storage expects memory, sqlite, replicated or durable-streams/ },
    { name: "resume a database that does not exist", args: () => ["resume", "--db", "never-made", "--data-dir", data(), "--model", `scripted:${join(ROOT, "examples", "fix-calc.json")}`], code: 2, says: /database "never-made" does not exist/ },
    { name: "resume with a goal", args: () => ["resume", "new goal", "--db", "x", "--model", "scripted:x.json"], code: 2, says: /takes no goal/ },
    { name: "status of a database that does not exist", args: () => ["status", "--db", "never-made", "--data-dir", data()], code: 2, says: /does not exist/ },
    { name: "bad --max-rounds", args: () => ["run", "g", "--db", "x", "--max-rounds", "many", "--model", "scripted:x.json"], code: 2, says: /--max-rounds expects a positive whole number/ },
    { name: "bad --max-wall", args: () => ["run", "g", "--db", "x", "--max-wall", "soon", "--model", "scripted:x.json"], code: 2, says: /--max-wall expects a duration/ },
    { name: "post with bad JSON", args: () => ["post", "--db", "x", "--session", "s1", "--id", "a", "--kind", "k", "--payload", "{nope"], code: 2, says: /--payload is not valid JSON/ },
    { name: "replicated without endpoints", args: () => ["status", "--db", "x", "--storage", "replicated"], env: { CAIRN_ETCD_ENDPOINTS: "" }, code: 2, says: /needs etcd endpoints/ },
    { name: "cwd that is not a directory", args: () => ["run", "g", "--db", "x", "--cwd", "/nonexistent-dir", "--model", "scripted:x.json"], code: 2, says: /--cwd \/nonexistent-dir is not a directory/ },
  ];
  for (const c of cases) {
    it(c.name, async () => {
      const r = await cairnIn(c.args(), c.env ? { env: c.env } : {});
      assert.equal(r.code, c.code, `exit code for ${c.name}: ${r.stderr}`);
      assert.match(r.stderr, c.says);
      assert.ok(!hasStack(r.stderr), `no stack trace: ${r.stderr}`);
      assert.equal(r.stderr.trim().split("\n").length, 1, `one sentence: ${r.stderr}`);
    });
  }

  it("post refuses a forged id and a finished run, and delivers to a live one", async () => {
    const d = join(t.dir, "data-post");
    const cwd = project();
    // A run killed right after its first patch commit: unfinished, with a queued cell.
    const killed = await cairn([...demoArgs("posty", cwd).map((a) => (a === join(t.dir, "data") ? d : a))], { env: { CAIRN_CHAOS_KILL_AT: "patch:committed" } });
    assert.equal(killed.signal, "SIGKILL");
    const base = ["post", "--db", "posty", "--data-dir", d, "--session", "s1", "--kind", "ci"];
    const forged = await cairnIn([...base, "--id", "execution:9", "--payload", "{}"]);
    assert.equal(forged.code, 2);
    assert.match(forged.stderr, /reserved for the harness/);
    const ok = await cairnIn([...base, "--id", "ci-1", "--payload", '{"green":true}']);
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /posted ci-1/);
    const resumed = await cairnIn(["resume", "--db", "posty", "--data-dir", d, "--model", `scripted:${join(ROOT, "examples", "fix-calc.json")}`, "--json"]);
    // The extra observation changes which scripted round sees what, so the run may end either way;
    // what matters here is the delivery.
    assert.ok(resumed.code === 0 || resumed.code === 1, resumed.stderr);
    const events = resumed.stdout.trim().split("\n").map((l) => JSON.parse(l));
    const got = events.filter((e: { kind: string; body: { observation?: { id: string } } }) => e.kind === "inbox_received" && e.body.observation?.id === "ci-1");
    assert.equal(got.length, 1, "the owner moved the mailbox message into the inbox exactly once");
    const again = await cairnIn([...base, "--id", "ci-1", "--payload", '{"green":true}']);
    assert.equal(again.code, 0);
    assert.match(again.stdout, /already delivered/);
    const conflict = await cairnIn([...base, "--id", "ci-1", "--payload", '{"green":false}']);
    assert.equal(conflict.code, 2);
    assert.match(conflict.stderr, /other content/);
    const ended = await cairnIn([...base, "--id", "ci-2", "--payload", "{}"]);
    assert.equal(ended.code, 2);
    assert.match(ended.stderr, /has ended/);
  });
});
