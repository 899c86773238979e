/**
 * Issue 10 through the CLI (`main` in this process, and child processes for the end-to-end cases): a file that is not a Cairn database is refused and
 * left byte-identical, flags are validated before anything is created, a 401 parks the run until the
 * key is fixed, and the CLI's failures are one sentence with the documented exit code.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { cairn as cairnCli, cairnIn, ENTRY, hasStack } from "../cli/support.js";
import { tempDir } from "../harness/support.js";
import { errorReply, revisionOf, startProvider, stepReply } from "./provider-server.js";
import { describeError, EXIT } from "../../src/cli/exit.js";

/** The CLI with a generous hang guard: on a loaded 2-core machine a cold tsx start alone takes tens of seconds. */
const cairn = (args: string[], opts: { env?: NodeJS.ProcessEnv } = {}) => cairnCli(args, { ...opts, timeoutMs: 180_000 });

let t: { dir: string; cleanup(): void };
before(() => {
  t = tempDir("cairn-hostile-cli-");
});
after(() => t.cleanup());

function oneSentence(stderr: string): void {
  assert.ok(!hasStack(stderr), `no stack trace: ${stderr}`);
  assert.equal(stderr.trim().split("\n").length, 1, `one line on stderr, got:\n${stderr}`);
}

const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

function script(file: string, rounds: unknown[][]): string {
  writeFileSync(file, JSON.stringify({ rounds: rounds.map((patch) => ({ patch })) }));
  return `scripted:${file}`;
}
const concludeAt = (revision: number, result = "success") => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id: revision + 1, previous_id: null, kind: "note", role: "conclusion", result, text: "done" } },
];

describe("a file that is not a Cairn database is refused, untouched (CLI)", () => {
  // The adapter-level cases (every kind of foreign file, every entry point) are in
  // sqlite-format.test.ts; here the two the issue reproduced, through the real CLI.
  const cases: { name: string; command: "resume" | "run"; make: (path: string) => void }[] = [
    { name: "a 0-byte file", command: "resume", make: (p) => writeFileSync(p, "") },
    {
      name: "another program's SQLite database",
      command: "run",
      make: (p) => execFileSync("python3", ["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('create table notes(x text)'); c.execute(\"insert into notes values ('mine')\"); c.commit(); c.close()", p]),
    },
  ];
  for (const [k, c] of cases.entries()) {
    it(`${c.name}: cairn ${c.command} exits 2 with one sentence; the file is byte-identical and no WAL appears`, async () => {
      const dir = join(t.dir, `foreign-${k}`);
      mkdirSync(dir, { recursive: true });
      const file = join(dir, "X.db");
      c.make(file);
      const before = sha(file);
      const model = script(join(dir, "m.json"), [concludeAt(0)]);
      const args = c.command === "resume" ? ["resume", "--db", "X", "--data-dir", dir, "--model", model] : ["run", "goal", "--db", "X", "--data-dir", dir, "--model", model];
      const r = await cairn(args);
      assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}`);
      assert.match(r.stderr, /is not a Cairn database/);
      oneSentence(r.stderr);
      assert.equal(sha(file), before, "the file changed");
      assert.equal(existsSync(`${file}-wal`), false, "a WAL file appeared");
    });
  }
});

describe("flags are validated before anything is created", () => {
  for (const [flag, value] of [
    ["--max-rounds", "99999999999999999999"],
    ["--max-wall", "9".repeat(400) + "d"],
    ["--model-retry-budget", "forever"],
  ] as const) {
    it(`${flag} ${value.slice(0, 24)}: exit 2, one sentence, no database file`, async () => {
      const dir = join(t.dir, `flags-${flag}-${value.length}`);
      const model = script(join(t.dir, "flags.json"), [concludeAt(0)]);
      const r = await cairnIn(["run", "goal", "--db", "F", "--data-dir", dir, "--model", model, `${flag}=${value}`]);
      assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}`);
      oneSentence(r.stderr);
      assert.equal(existsSync(join(dir, "F.db")), false, "the database was created before the flags were checked");
    });
  }

  it("--data-dir naming a regular file: exit 2, one sentence", async () => {
    const file = join(t.dir, "not-a-dir");
    writeFileSync(file, "x");
    const model = script(join(t.dir, "dd.json"), [concludeAt(0)]);
    for (const args of [["run", "goal", "--db", "D", "--data-dir", file, "--model", model]]) {
      const r = await cairnIn(args);
      assert.equal(r.code, 2, `${args[0]}: exit ${r.code}: ${r.stderr}`);
      oneSentence(r.stderr);
    }
  });

  it("an internal error (a bug) has its own exit code, distinct from a failed run", () => {
    const d = describeError(new TypeError("x is not a function"));
    assert.equal(d.code, EXIT.internal);
    assert.notEqual(EXIT.internal, EXIT.failure);
    assert.match(d.message, /internal error/);
    assert.equal(describeError(new Error("line one\n  at a\n  at b")).message.includes("\n"), false);
  });
});

describe("cairn status | head", () => {
  it("a reader that goes away early ends status quietly (no EPIPE stack)", async () => {
    const dir = join(t.dir, "pipe");
    const model = script(join(t.dir, "pipe.json"), [concludeAt(0)]);
    const r = await cairnIn(["run", "g".repeat(60_000), "--db", "P", "--data-dir", dir, "--model", model]);
    assert.equal(r.code, 0, r.stderr);
    const out = await new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
      const child = spawn("sh", ["-c", `"${process.execPath}" --import tsx "${ENTRY}" status --db P --data-dir "${dir}" --json | head -c 10 >/dev/null; exit \${PIPESTATUS:-0}`], { stdio: ["ignore", "ignore", "pipe"] });
      let stderr = "";
      child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
      child.on("error", reject);
      child.on("close", (code) => resolve({ code, stderr }));
    });
    assert.ok(!hasStack(out.stderr), `no stack trace: ${out.stderr}`);
    assert.doesNotMatch(out.stderr, /EPIPE/);
  });
});

describe("a 401, then the key fixed, then cairn resume", () => {
  it("parks the run as blocked (exit 2, status blocked), and resume with the right key finishes it", async () => {
    const server = await startProvider((req) => (req.key === "sk-good-key" ? stepReply(concludeAt(revisionOf(req.body))) : errorReply(401)));
    try {
      const dir = join(t.dir, "auth");
      const base = ["--db", "A", "--data-dir", dir, "--model", "anthropic/claude-test"];
      const bad = await cairn(["run", "goal", ...base], { env: { ANTHROPIC_BASE_URL: server.url, ANTHROPIC_API_KEY: "sk-bad-key" } });
      assert.equal(bad.code, 2, `exit ${bad.code}: ${bad.stderr}`);
      assert.match(bad.stderr, /blocked/);
      assert.ok(!hasStack(bad.stderr), bad.stderr);
      assert.ok(!bad.stderr.includes("sk-bad-key"), "the key never appears");
      const st = await cairn(["status", "--db", "A", "--data-dir", dir, "--json"]);
      assert.equal(st.code, 0, st.stderr);
      const doc = JSON.parse(st.stdout) as { sessions: { status: string; blocked: { cause: string; reason: string } | null }[] };
      assert.equal(doc.sessions[0]!.status, "blocked");
      assert.equal(doc.sessions[0]!.blocked?.cause, "auth");
      const again = await cairn(["resume", ...base], { env: { ANTHROPIC_BASE_URL: server.url, ANTHROPIC_API_KEY: "sk-bad-key" } });
      assert.equal(again.code, 2, "still the wrong key: still blocked, still exit 2");
      const fixed = await cairn(["resume", ...base], { env: { ANTHROPIC_BASE_URL: server.url, ANTHROPIC_API_KEY: "sk-good-key" } });
      assert.equal(fixed.code, 0, `exit ${fixed.code}: ${fixed.stdout}\n${fixed.stderr}`);
      assert.match(fixed.stdout, /run s1 succeeded/);
    } finally {
      await server.close();
    }
  });
});
