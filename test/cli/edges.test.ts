/**
 * `cairn` inputs at their edges, and SIGTERM on a running `cairn run`.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cairnIn as cairn, ENTRY, hasStack } from "./support.js";
import { tempDir } from "../harness/support.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let t: { dir: string; cleanup(): void };
before(() => {
  t = tempDir("cairn-cli-edges-");
});
after(() => t.cleanup());

function script(file: string, rounds: unknown[][]): string {
  writeFileSync(file, JSON.stringify({ rounds: rounds.map((patch) => ({ patch })) }));
  return `scripted:${file}`;
}

const add = (rev: number, cells: Record<string, unknown>[]) => [
  { op: "test", path: "/revision", value: rev },
  ...cells.map((c, i) => ({ op: "add", path: "/cells/-", value: { id: rev === 0 ? i + 1 : 0, previous_id: null, ...c } })),
];

function oneSentence(stderr: string): void {
  assert.ok(!hasStack(stderr), `no stack trace: ${stderr}`);
  assert.equal(stderr.trim().split("\n").length, 1, `one line on stderr, got:\n${stderr}`);
}

describe("cairn inputs", () => {
  it("--max-wall 0 is bad usage (exit 2, one sentence), like --max-rounds 0", async () => {
    const model = script(join(t.dir, "m0.json"), [add(0, [{ kind: "note", text: "x" }])]);
    const r = await cairn(["run", "g", "--db", "w0", "--data-dir", join(t.dir, "d0"), "--model", model, "--max-wall", "0"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /--max-wall/);
    oneSentence(r.stderr.split("\n").filter((l) => !l.startsWith("cairn: database")).join("\n"));
  });

  it("--payload -1 (a negative JSON number) gets one sentence naming the fix", async () => {
    const r = await cairn(["post", "--db", "x", "--data-dir", join(t.dir, "d1"), "--session", "s1", "--id", "a", "--kind", "k", "--payload", "-1"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /--payload=-1|--payload=/);
    oneSentence(r.stderr);
  });

  it("a deeply nested --payload is bad usage (exit 2), not an internal failure", async () => {
    const deep = "[".repeat(20_000) + "]".repeat(20_000);
    const r = await cairn(["post", "--db", "x", "--data-dir", join(t.dir, "d1"), "--session", "s1", "--id", "a", "--kind", "k", "--payload", deep]);
    assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}`);
    oneSentence(r.stderr);
  });
});

describe("SIGTERM on cairn run", () => {
  it("exits 143, stops the running cell's group, and resume records it as UnknownExecution without re-running it", async () => {
    const data = join(t.dir, "dterm");
    const pidFile = join(t.dir, "cell.pid");
    // A sleep of its own length, found on this host by its command line (inside its sandbox the
    // cell's own pids are its PID namespace's).
    const sleepFor = `30.${process.pid}`;
    const sleeping = (): boolean =>
      readdirSync("/proc").some((e) => {
        try {
          return /^\d+$/.test(e) && readFileSync(`/proc/${e}/cmdline`, "utf8") === `sleep\0${sleepFor}\0`;
        } catch {
          return false;
        }
      });
    const effect = join(t.dir, "effect");
    const model = script(join(t.dir, "mterm.json"), [
      add(0, [{ kind: "cmd", argv: ["sh", "-c", `echo run >> ${effect}; echo started > ${pidFile}; sleep ${sleepFor}`] }]),
      [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "saw it" } }],
    ]);
    const child = spawn(process.execPath, ["--import", "tsx", ENTRY, "run", "g", "--db", "term", "--data-dir", data, "--cwd", t.dir, "--model", model, "--validator", `sh -c 'exit 0'`], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)));
    try {
      for (let i = 0; i < 3000 && !(existsSync(pidFile) && readFileSync(pidFile, "utf8").trim() !== ""); i++) await sleep(20);
      assert.ok(sleeping(), "the cell's sleep runs");
      child.kill("SIGTERM");
      const code = await exited;
      assert.equal(code, 143, stderr);
      assert.ok(!hasStack(stderr), stderr);
      let gone = false;
      for (let i = 0; i < 400 && !gone; i++) {
        gone = !sleeping();
        if (!gone) await sleep(50);
      }
      assert.ok(gone, "the cell's sleep survived SIGTERM of cairn run");
      const st = await cairn(["status", "--db", "term", "--data-dir", data, "--json"]);
      const doc = JSON.parse(st.stdout) as { sessions: { validators: string[][]; executions: { cell_id: number; phase: string }[] }[] };
      assert.deepEqual(doc.sessions[0]!.validators, [["sh", "-c", "exit 0"]], "quotes in --validator group words");
      assert.equal(doc.sessions[0]!.executions[0]!.phase, "started");
      const res = await cairn(["resume", "--db", "term", "--data-dir", data, "--model", model, "--json"]);
      assert.equal(res.code, 1, res.stderr);
      const events = res.stdout.trim().split("\n").map((l) => JSON.parse(l) as { kind: string; body: { result?: string } });
      assert.equal(events.find((e) => e.kind === "execution_finished")?.body.result, "UnknownExecution");
      assert.equal(readFileSync(effect, "utf8"), "run\n", "the cell ran exactly once");
    } finally {
      child.kill("SIGKILL");
    }
  });
});
