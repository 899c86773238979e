import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { writeFileSync } from "node:fs";
import { cairn, ENTRY, ROOT } from "./support.js";
import { tempDir } from "../harness/support.js";
import { untilQuiet as until } from "../support/wait.js";

const t = tempDir("cairn-serve-");
const children: ChildProcess[] = [];
after(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  t.cleanup();
});

/** Parses the Prometheus text format into {series -> value}. */
function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line.trim() === "") continue;
    const i = line.lastIndexOf(" ");
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

function sum(m: Map<string, number>, prefix: string, labels: string[] = []): number {
  let total = 0;
  for (const [k, v] of m) if ((k === prefix || k.startsWith(`${prefix}{`)) && labels.every((l) => k.includes(l))) total += v;
  return total;
}


describe("cairn serve", () => {
  it("resumes a run, exports metrics that move, and exits 3 with /readyz unready once taken over", async () => {
    const data = join(t.dir, "data");
    const script = join(t.dir, "rounds.json");
    writeFileSync(
      script,
      JSON.stringify({
        rounds: [
          { patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["sh", "-c", "echo working; sleep 1.5; echo done"] } }] },
          { patch: [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "cmd", argv: ["true"] } }] },
          { patch: [{ op: "test", path: "/revision", value: 2 }, { op: "add", path: "/cells/-", value: { id: 3, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" } }] },
        ],
      }),
    );
    const common = ["--db", "svc", "--data-dir", data, "--model", `scripted:${script}`];
    // An unfinished run: killed right after its first patch was committed.
    const killed = await cairn(["run", "serve me", ...common, "--cwd", t.dir], { env: { CAIRN_CHAOS_KILL_AT: "patch:committed" } });
    assert.equal(killed.signal, "SIGKILL");

    const serve = spawn(process.execPath, ["--import", "tsx", ENTRY, "serve", ...common, "--listen", "127.0.0.1:0", "--log-level", "info", "--fenced-linger", "10s"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    children.push(serve);
    let stderr = "";
    serve.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => serve.on("close", (code) => resolve(code)));
    const url = await until("the metrics URL", async () => /metrics on (http:\/\/[^\s]+)\/metrics/.exec(stderr)?.[1]);

    // During the run: owner, ready, a cell running.
    const during = await until("a running cell", async () => {
      const m = parseMetrics(await (await fetch(`${url}/metrics`)).text());
      return sum(m, "cairn_executions_running") === 1 ? m : undefined;
    });
    assert.equal(sum(during, "cairn_owner"), 1);
    assert.equal(sum(during, "cairn_resumes_total"), 1);
    assert.ok(sum(during, "cairn_ownership_epoch") >= 2);
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    assert.equal((await fetch(`${url}/readyz`)).status, 200);

    // After: one run succeeded, two executions, commits recorded with latency samples.
    const done = await until("the run to end", async () => {
      const m = parseMetrics(await (await fetch(`${url}/metrics`)).text());
      return sum(m, "cairn_runs_ended_total", ['result="success"']) === 1 ? m : undefined;
    });
    assert.equal(sum(done, "cairn_executions_total", ['kind="cmd"', 'result="success"']), 2);
    assert.equal(sum(done, "cairn_executions_total"), 2);
    const commits = sum(done, "cairn_storage_commits_total", ['adapter="sqlite"', 'outcome="ok"']);
    assert.ok(commits >= 8, `commits counted: ${commits}`);
    assert.equal(sum(done, "cairn_storage_commit_duration_seconds_count", ['adapter="sqlite"']), commits);
    assert.ok(sum(done, "cairn_storage_commit_duration_seconds_sum") > 0);
    assert.ok(sum(done, "cairn_model_rounds_total") >= 2);
    assert.equal(sum(done, "cairn_runs_active"), 0);
    assert.ok(sum(done, "cairn_build_info") === 1);
    assert.ok([...done.keys()].some((k) => k.startsWith("process_cpu_user_seconds_total")), "standard process metrics are exported");
    assert.ok([...done.keys()].filter((k) => k.startsWith("cairn_")).every((k) => k.includes(`db="svc"`)), "every series carries the database name");

    // Another process takes the database over.
    // (an explicit takeover: `cairn resume` takes the owner lease and fences the live serve)
    const resumed = cairn(["resume", ...common]);
    // Unready first may read "the ownership lease ... is not held" (the new owner's claim ends the
    // liveness lease) before the fence is seen: wait for the fenced state itself.
    const unready = await until("/readyz to turn unready as fenced", async () => {
      const r = await fetch(`${url}/readyz`);
      if (r.status !== 503) return undefined;
      const text = await r.text();
      return /fenced/.test(text) ? text : undefined;
    }, 120_000);
    const takeover = await resumed;
    assert.equal(takeover.code, 0, takeover.stderr);
    assert.match(unready, /fenced/);
    const fencedMetrics = parseMetrics(await (await fetch(`${url}/metrics`)).text());
    assert.equal(sum(fencedMetrics, "cairn_ownership_fenced_total"), 1);
    assert.equal(sum(fencedMetrics, "cairn_owner"), 0);
    assert.equal(await exited, 3, stderr);
    assert.match(stderr, /fenced/);
  });
});
