/**
 * `cairn fork` through the CLI, as an operator types it: a real `cairn serve` worker owns the
 * database (sqlite, then the replicated adapter on a 3-member etcd cluster this file starts), a run
 * is submitted, and while its cell still runs it is forked after that round from another process.
 * The fork runs on its own from the origin's State, never launches the cell that was in flight (the
 * cell appends a line to a file: one line, one launch), and `cairn status` and `cairn log` show
 * where it comes from. Every bad request gets one sentence and exit 2, and makes nothing.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { runCairn, startCairn, cleanupProcesses, describe as said, type CliResult } from "../../chaos/support/cli.js";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";

const t = tempDir("cairn-cli-fork-");
let cluster: DevCluster | null = null;
before(async () => {
  cluster = await startDevCluster({ dir: join(t.dir, "etcd") });
});
after(async () => {
  cleanupProcesses();
  await cluster?.stop();
  t.cleanup();
});

type Op = Record<string, unknown>;
const cmdRound = (revision: number, id: number, argv: string[]): Op[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv } },
];
const concludeRound = (revision: number, id: number, text: string): Op[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text } },
];
const lines = (file: string): number => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0);

interface Adapter {
  readonly name: string;
  flags(role: string): string[];
}
const sqlite: Adapter = { name: "sqlite", flags: () => ["--data-dir", join(t.dir, "sqlite-data")] };
const replicated: Adapter = { name: "replicated", flags: (role) => ["--storage", "replicated", "--etcd", cluster!.endpoints.join(","), "--data-dir", join(t.dir, `etcd-data-${role}`)] };

interface RunView {
  id: string;
  status: string;
  fork_of: { session: string; round: number } | null;
  result: { result: string; reason: string } | null;
}

function forkThroughCli(adapter: Adapter): void {
  it(`${adapter.name}: a run forked after the round whose cell is still running; the fork goes on alone, the cell runs once`, async () => {
    const work = join(t.dir, `${adapter.name}-work`);
    mkdirSync(work, { recursive: true });
    const model = join(t.dir, `${adapter.name}-model.json`);
    const gated = ["sh", "-c", "echo ran >> effect.txt; i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"];
    writeFileSync(model, JSON.stringify({ rounds: [cmdRound(0, 1, ["sh", "-c", "echo one"]), cmdRound(1, 2, gated), concludeRound(2, 3, "end")].map((patch) => ({ patch })) }));
    const db = "fk";
    const cli = (args: string[]): Promise<CliResult> => runCairn([...args, "--db", db, ...adapter.flags("cli")], {}, 120_000);
    const view = async (session: string): Promise<RunView | undefined> => {
      const r = await cli(["status", "--session", session, "--json"]);
      return r.code === 0 ? (JSON.parse(r.stdout) as { sessions: RunView[] }).sessions[0] : undefined;
    };
    const serve = startCairn(["serve", "--db", db, ...adapter.flags("serve"), "--model", `scripted:${model}`, "--create", "--cwd", work, "--listen", "127.0.0.1:0"], {}, 400_000);
    try {
      const submitted = await cli(["submit", "a run to fork", "--session", "job1"]);
      assert.equal(submitted.code, 0, said(submitted));
      await until("cell 2 to run", () => lines(join(work, "effect.txt")) === 1, 120_000);

      const forked = await cli(["fork", "--session", "job1", "--at-round", "2", "--new-session", "try2", "--reason", "another way", "--json"]);
      assert.equal(forked.code, 0, said(forked));
      assert.deepEqual(JSON.parse(forked.stdout), { status: "applied", message: "fork of run job1 after round 2 as run try2: done", request: (JSON.parse(forked.stdout) as { request: string }).request, session: "try2" });

      // Bad requests: one sentence each, exit 2, nothing made.
      const bad: [string[], RegExp][] = [
        [["--session", "job1", "--at-round", "7"], /^cairn: run job1 has 2 accepted rounds; the round to fork after must be between 0 and 2\n$/],
        [["--session", "nope", "--at-round", "1"], /^cairn: run "nope" does not exist in database "fk"\.\n$/],
        [["--session", "job1", "--at-round", "1", "--new-session", "try2"], /^cairn: run try2 already exists in database "fk"; choose another id for the fork\n$/],
        [["--session", "job1", "--at-round", "1", "--new-session", "s7"], /^cairn: cairn fork: --new-session "s7" has the form Cairn reserves/],
        [["--session", "job1", "--at-round", "two"], /^cairn: cairn fork: --at-round must be a whole number from 0, got "two"\.\n$/],
        [["--session", "job1"], /--at-round is required/],
      ];
      for (const [args, message] of bad) {
        const r = await cli(["fork", ...args]);
        assert.equal(r.code, 2, said(r));
        assert.match(r.stderr, message);
      }

      const fork = await until("the fork to end", async () => {
        const v = await view("try2");
        return v?.result ? v : undefined;
      }, 120_000);
      assert.deepEqual(fork.fork_of, { session: "job1", round: 2 });
      assert.equal(fork.result!.reason, "the model concluded failure: end");
      const text = await cli(["status", "--session", "try2"]);
      assert.match(text.stdout, /fork of run job1 after round 2/);
      const log = await cli(["log", "--session", "try2"]);
      assert.equal(log.code, 0, said(log));
      assert.match(log.stdout, /a fork of run job1 after round 2/);
      assert.match(log.stdout, /ready: \d+ event\(s\) copied from its origin/);
      const json = await cli(["log", "--session", "try2", "--json"]);
      const events = json.stdout.trim().split("\n").map((l) => JSON.parse(l) as { kind: string; identity: string; body: Record<string, unknown> });
      const finished = events.filter((e) => e.kind === "execution_finished").map((e) => [e.body.cell_id, e.body.result]);
      assert.deepEqual(finished, [[1, "success"], [2, "UnknownExecution"]]);
      assert.equal(events.filter((e) => e.kind === "execution_started" && !e.identity.startsWith("fork:")).length, 0, "the fork launched nothing");
      const told = events.find((e) => e.kind === "inbox_received" && (e.body.observation as { id: string }).id === "control:fork")!;
      assert.match(JSON.stringify(told.body), /fork of run job1 after round 2.*cell 2 \(UnknownExecution\).*another way/);

      writeFileSync(join(work, "release"), "");
      const origin = await until("the origin to end", async () => {
        const v = await view("job1");
        return v?.result ? v : undefined;
      }, 120_000);
      assert.equal(origin.fork_of, null);
      assert.equal(origin.result!.reason, "the model concluded failure: end");
      assert.equal(lines(join(work, "effect.txt")), 1, "cell 2 ran exactly once, in the origin");
      const again = await cli(["fork", "--session", "job1", "--at-round", "2", "--new-session", "try2"]);
      assert.equal(again.code, 0, said(again));
      assert.match(again.stdout, /run try2 is already the fork of run job1 after round 2/);
    } finally {
      serve.child.kill("SIGTERM");
      await serve.result;
    }
  });
}

describe("cairn fork through the CLI", { timeout: 900_000 }, () => {
  forkThroughCli(sqlite);
  forkThroughCli(replicated);

  it("sqlite: with no live owner the fork waits in the mailbox, and the next owner makes it before anything else and drives it", async () => {
    const work = join(t.dir, "waiting-work");
    mkdirSync(work, { recursive: true });
    const model = join(t.dir, "waiting-model.json");
    writeFileSync(model, JSON.stringify({ rounds: [cmdRound(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludeRound(1, 2, "end")].map((patch) => ({ patch })) }));
    const flags = ["--db", "wt", ...sqlite.flags("cli")];
    const first = await runCairn(["run", "a run that ends", ...flags, "--cwd", work, "--model", `scripted:${model}`], {}, 120_000);
    assert.equal(first.code, 1, said(first));
    const asked = await runCairn(["fork", "--session", "s1", "--at-round", "1", "--new-session", "again", ...flags], {}, 120_000);
    assert.equal(asked.code, 0, said(asked));
    assert.match(asked.stdout, /^cairn: the fork of run s1 after round 1 as run again waits in the mailbox: no live worker owns "wt" now/);
    const resumed = await runCairn(["resume", ...flags, "--model", `scripted:${model}`], {}, 120_000);
    assert.equal(resumed.code, 1, said(resumed));
    const json = await runCairn(["log", "--json", ...flags], {}, 120_000);
    const events = json.stdout.trim().split("\n").map((l) => JSON.parse(l) as { kind: string; session: string; seq: number; identity: string; body: Record<string, unknown> });
    const claim = events.find((e) => e.kind === "owner_claimed" && (e.body.epoch as number) > 1)!;
    const created = events.find((e) => e.kind === "session_created" && e.session === "again")!;
    assert.ok(created.seq <= claim.seq + 1, "the fork is the next owner's first act");
    const ended = events.find((e) => e.kind === "run_ended" && e.session === "again")!;
    assert.equal(ended.body.reason, "the model concluded failure: end");
    assert.equal(lines(join(work, "effect.txt")), 1, "cell 1 ran once, in the origin; the fork copied its result");
  });
});
