/**
 * `cairn log` through the real command, on a real run with a failure, an UnknownExecution and a
 * failover between two processes: every round and cell with times, owners, --json exact against
 * the storage, --follow while the run goes on (without disturbing the owner), colour rules.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, type ChildProcess } from "node:child_process";
import { stripVTControlCharacters } from "node:util";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { ENTRY, hasStack, ROOT } from "./support.js";
import { main } from "../../src/cli/main.js";
import type { LogEvent } from "../../src/state/events.js";
import { tempDir } from "../harness/support.js";
import { killAll, runScenario, spawnCairn, until, type Scenario } from "../ui/scenario.js";

const t = tempDir("cairn-log-");
const ESC = "\u001b[";
const children: ChildProcess[] = [];
let sc: Scenario;
let followJson: ReturnType<typeof spawnCairn>;
let followText: ReturnType<typeof spawnCairn>;
/** Lines --follow had printed before the gate opened (the run still going). */
let jsonBeforeGate = 0;

before(async () => {
  sc = await runScenario(t.dir, children);
  followJson = spawnCairn(["log", ...sc.flags, "--session", "s1", "--follow", "--json", "--poll-ms", "50"], children);
  followText = spawnCairn(["log", ...sc.flags, "--session", "s1", "--follow", "--poll-ms", "50"], children);
  await until("--follow to print the history so far", () => followJson.out().includes('"execution_started"') && followText.out().includes("cell 4"));
  jsonBeforeGate = followJson.out().trim().split("\n").length;
  sc.open();
  const bExit = await sc.b.exit;
  assert.equal(bExit.code, 0, `B finishes the run while logs follow it: ${sc.b.err()}`);
});
after(() => {
  killAll(children);
  t.cleanup();
});

/** Runs `cairn ARGS` in this process (the same code path as the command, without a spawn per call). */
async function cairn(args: string[], opts: { env?: NodeJS.ProcessEnv; isTTY?: boolean } = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = "";
  let stderr = "";
  const code = await main(args, { out: (l) => (stdout += `${l}\n`), err: (l) => (stderr += `${l}\n`), env: { ...process.env, FORCE_COLOR: "", NO_COLOR: "", ...opts.env }, isTTY: opts.isTTY ?? false });
  return { code, stdout, stderr };
}

async function storedEvents(): Promise<LogEvent[]> {
  const storage = createSqliteStorage({ dataDir: sc.dataDir });
  try {
    const r = await storage.reader(sc.db);
    try {
      return await r.read(0);
    } finally {
      await r.close();
    }
  } finally {
    await storage.close();
  }
}

describe("cairn log", () => {
  it("shows every round and cell with relative times, where cells ran, the failure, the UnknownExecution and its resolution, owners and the end", async () => {
    const r = await cairn(["log", ...sc.flags]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, "");
    const lines = r.stdout.trimEnd().split("\n");
    const find = (re: RegExp): number => {
      const i = lines.findIndex((l) => re.test(l));
      assert.ok(i >= 0, `a line matching ${re} in:\n${r.stdout}`);
      return i;
    };
    // Every line is aligned: the time column right-aligned in 11 characters, or blank for continuations.
    for (const l of lines) assert.match(l, /^( {0,10}\+\d+:\d\d[.:]\d{2,3}| {11}) {2}s1 {3}\S|^ {11} {2}s1 {3} {10} /, `aligned: ${JSON.stringify(l)}`);
    const order = [
      find(/run\s+s1 started .*"Rebuild after a broken build"/),
      find(/owner\s+epoch 1 on \S+ \(pid \d+\)/),
      find(/round 1\s+prepared at revision 0/),
      find(/round 1\s+accepted: revision 1; 1 attempt\(s\), model \d+ ms, tokens \d+ in \/ \d+ out/),
      find(/\+ cell 1 cmd: sh -c echo 'checking the build'/),
      find(/cell 1\s+cmd started on \S+ epoch 1 \(pid \d+, sandbox (bwrap, network off|none)\)/),
      find(/│ build broken/),
      find(/cell 1\s+error exit 3 in \d+ ms/),
      find(/round 2\s+accepted/),
      find(/cell 2\s+cmd started on \S+ epoch 1/),
      find(/│ long job$/),
      find(/owner\s+epoch 2 on \S+ \(pid \d+\)/),
      find(/cell 2\s+UnknownExecution: \S+ \(worker stopped: yes\); never re-run/),
      find(/round 3\s+prepared at revision 2, 1 observation\(s\): execution:2/),
      find(/\+ cell 3 note \(resolution\): cell 2 was interrupted/),
      find(/resolution note 3: resolved/),
      find(/cell 4\s+cmd started on \S+ epoch 2/),
      find(/cell 4\s+success exit 0/),
      find(/round 4\s+accepted/),
      find(/conclude\s+note 5: concluded/),
      find(/end\s+run s1 success/),
    ];
    assert.deepEqual(order, [...order].sort((a, b) => a - b), `in commit order:\n${r.stdout}`);
    // Relative times grow along the run.
    const times = lines.map((l) => /^\s*\+(\d+):(\d\d)\.(\d{3})/.exec(l)).filter((m) => m !== null).map((m) => Number(m[1]) * 60_000 + Number(m[2]) * 1000 + Number(m[3]));
    assert.equal(times[0], 0);
    assert.deepEqual(times, [...times].sort((a, b) => a - b));
    assert.ok(times.at(-1)! > 0);
    assert.equal(r.stdout.includes(ESC), false, "no colour when piped");
  });

  it("--json prints exactly the events the storage holds, one per line, and round-trips", async () => {
    const r = await cairn(["log", ...sc.flags, "--json"]);
    assert.equal(r.code, 0, r.stderr);
    const printed: LogEvent[] = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    const stored = await storedEvents();
    assert.deepEqual(printed, stored);
    assert.deepEqual(r.stdout.trimEnd().split("\n"), stored.map((e) => JSON.stringify(e)), "byte for byte as the storage returns them");
    const kinds = new Set<string>(printed.map((e) => e.kind));
    for (const k of ["owner_claimed", "execution_finished", "control_handled", "run_ended"]) assert.ok(kinds.has(k), k);
    assert.equal(printed.filter((e) => e.kind === "owner_claimed").length, 2, "one ownership change per epoch that acted on the session");
  });

  it("--follow (from a reader) prints events as they commit and never disturbs the owner", async () => {
    await until("--follow to exit after the run ended", () => followJson.child.exitCode !== null && followText.child.exitCode !== null, 60_000);
    assert.equal(followJson.child.exitCode, 0, followJson.err());
    assert.equal(followText.child.exitCode, 0, followText.err());
    const stored = await storedEvents();
    const printed: LogEvent[] = followJson.out().trimEnd().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(printed, stored, "--follow --json printed every event once, in order");
    assert.ok(jsonBeforeGate < stored.length, "some events arrived after --follow had started (while the run went on)");
    assert.ok(printed.slice(jsonBeforeGate).some((e) => e.kind === "run_ended"));
    const full = await cairn(["log", ...sc.flags, "--session", "s1"]);
    assert.equal(followText.out(), full.stdout, "followed text equals the text printed afterwards");
    // The owner (B) was never fenced by the readers: it finished with exit 0 (asserted in before) and
    // there are exactly two epochs in the log.
    assert.equal(stored.filter((e) => e.kind === "owner_claimed").length, 2);
  });

  it("--cell shows only what concerns that cell", async () => {
    const r = await cairn(["log", ...sc.flags, "--cell", "2"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /\+ cell 2 cmd/);
    assert.match(r.stdout, /cell 2\s+cmd started/);
    assert.match(r.stdout, /cell 2\s+UnknownExecution/);
    assert.match(r.stdout, /round 2\s+accepted/);
    assert.doesNotMatch(r.stdout, /cell 1|cell 4|round 3/);
    const j = await cairn(["log", ...sc.flags, "--cell", "2", "--json"]);
    const events = j.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    assert.ok(events.length >= 4);
    for (const e of events) assert.ok(e.body.cell_id === 2 || e.body.new_cell_ids?.includes(2) || e.body.observation?.id === "execution:2", JSON.stringify(e));
  });

  it("colour only on a terminal (or FORCE_COLOR), never with NO_COLOR", async () => {
    const piped = await cairn(["log", ...sc.flags], { isTTY: false });
    assert.equal(piped.stdout.includes(ESC), false);
    const forced = await cairn(["log", ...sc.flags], { env: { FORCE_COLOR: "1" } });
    assert.ok(forced.stdout.includes(`${ESC}32m`));
    const no = await cairn(["log", ...sc.flags], { env: { FORCE_COLOR: "1", NO_COLOR: "1" }, isTTY: true });
    assert.equal(no.stdout.includes(ESC), false);
    const dumb = await cairn(["log", ...sc.flags], { env: { TERM: "dumb" }, isTTY: true });
    assert.equal(dumb.stdout.includes(ESC), false);
    // A real pseudo-terminal, through script(1).
    const cmd = [process.execPath, "--import", "tsx", ENTRY, "log", ...sc.flags].map((a) => `'${a}'`).join(" ");
    const env: NodeJS.ProcessEnv = { ...process.env, TERM: "xterm" };
    delete env.FORCE_COLOR;
    delete env.NO_COLOR;
    const tty = spawnSync("script", ["-qec", cmd, "/dev/null"], { cwd: ROOT, env, encoding: "utf8", timeout: 60_000 });
    assert.equal(tty.status, 0, tty.stderr);
    assert.ok(tty.stdout.includes(`${ESC}32m`), "coloured on a terminal");
    assert.match(stripVTControlCharacters(tty.stdout), /run\s+s1 started/);
  });

  it("bad input: one sentence and exit 2", async () => {
    for (const [args, re] of [
      [["log", "--db", "nope", "--data-dir", sc.dataDir], /nope/],
      [["log", ...sc.flags, "--session", "s9"], /session "s9" does not exist in database "timeline" \(it has s1\)/],
      [["log", ...sc.flags, "--cell", "x"], /--cell expects a positive whole number/],
      [["log", ...sc.flags, "--cell", "99"], /cell 99 does not exist/],
      [["log", ...sc.flags, "extra"], /takes no arguments/],
    ] as const) {
      const r = await cairn([...args]);
      assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, re);
      assert.equal(hasStack(r.stderr), false);
      assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
    }
  });
});
