/**
 * The executor against real processes: the launch gate, cmd and script cells, output capture and
 * limits, wall time and cancellation, all killing whole process groups.
 */
import assert from "node:assert/strict";
import { execa } from "execa";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createExecutor, type GatedLaunch, type LaunchSpec, type Prepared } from "../../src/exec/executor.js";
import { processStartTime } from "../../src/exec/identity.js";
import { liveGroupMembers } from "../../src/exec/procfs.js";
import { which } from "../../src/exec/which.js";
import { collector, isAlive, killGroupQuietly, tempDir, waitFor } from "./helpers.js";

const tmp = tempDir();
const groups: number[] = [];
after(() => {
  for (const g of groups) killGroupQuietly(g);
  tmp.remove();
});

/** No uv, whatever this machine has: scripts take the python3 path. */
const noUv = (cmd: string): string | null => (cmd === "uv" ? null : which(cmd));
const executor = createExecutor({ which: noUv, killGraceMs: 500 });

let nextCell = 1;
function spec(cell: LaunchSpec["cell"], extra: Partial<LaunchSpec> = {}): LaunchSpec & { out: ReturnType<typeof collector> } {
  const out = collector();
  return {
    cellId: nextCell++,
    cell,
    cwd: tmp.dir,
    scriptDir: join(tmp.dir, "scripts"),
    wallTimeMs: 60_000,
    outputLimitBytes: 1 << 20,
    flushIntervalMs: 50,
    onOutput: out.onOutput,
    out,
    ...extra,
  };
}

function gated(p: Prepared): GatedLaunch {
  if (p.kind !== "gated") assert.fail(`expected a gated launch, got unlaunchable: ${p.outcome.detail}`);
  groups.push(p.identity.pgid);
  return p;
}

async function run(s: LaunchSpec, ex = executor) {
  const g = gated(await ex.prepare(s));
  g.release();
  return g.done;
}

describe("the launch gate", () => {
  test("the cell's code does not run before release, and does after", async () => {
    const marker = join(tmp.dir, "touched-by-release");
    const g = gated(await executor.prepare(spec({ kind: "cmd", argv: ["touch", marker] })));
    assert.equal(g.identity.pgid, g.identity.pid, "the child leads its own process group");
    assert.equal(processStartTime(g.identity.pid), g.identity.start_time);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(existsSync(marker), false, "nothing ran before release");
    assert.match(readFileSync(`/proc/${g.identity.pid}/cmdline`, "utf8"), /cairn-gate/, "the gate is waiting");
    g.release();
    const outcome = await g.done;
    assert.equal(outcome.result, "success", outcome.detail ?? "");
    assert.equal(existsSync(marker), true, "the cell ran after release");
    assert.throws(() => g.release(), /already/);
  });

  test("abort before release kills the gate: nothing ran, no process left", async () => {
    const marker = join(tmp.dir, "never-touched");
    const g = gated(await executor.prepare(spec({ kind: "cmd", argv: ["touch", marker] })));
    await g.abort();
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);
    assert.equal(isAlive(g.identity.pid), false);
    const outcome = await g.done;
    assert.equal(outcome.result, "cancelled");
    assert.match(outcome.detail ?? "", /never ran/);
    assert.equal(existsSync(marker), false);
    assert.throws(() => g.release(), /cannot release/);
  });

  test("if the process that prepared the launch dies before release, the gate exits and nothing runs", async () => {
    const marker = join(tmp.dir, "never-touched-after-crash");
    const executorUrl = new URL("../../src/exec/executor.ts", import.meta.url).href;
    const script = `
      import { createExecutor } from ${JSON.stringify(executorUrl)};
      const p = await createExecutor().prepare({ cellId: 1, cell: { kind: "cmd", argv: ["touch", ${JSON.stringify(marker)}] },
        cwd: ${JSON.stringify(tmp.dir)}, scriptDir: ${JSON.stringify(tmp.dir)}, wallTimeMs: 60000, outputLimitBytes: 1000,
        onOutput: async () => {} });
      console.log(JSON.stringify(p.identity));
      process.exit(0);
    `;
    const r = await execa(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { reject: false });
    assert.equal(r.exitCode, 0, r.stderr);
    const id = JSON.parse(r.stdout) as { pid: number; pgid: number };
    groups.push(id.pgid);
    await waitFor(() => !isAlive(id.pid), 10_000, "the orphaned gate to exit");
    assert.deepEqual(liveGroupMembers(id.pgid), []);
    assert.equal(existsSync(marker), false, "the cell never ran");
  });

  test("exec keeps the identity: after release the same pid and start time run the cell's init, whose child is the command, in the same group", async () => {
    const g = gated(await executor.prepare(spec({ kind: "cmd", argv: ["sleep", "30"] })));
    g.release();
    await waitFor(() => readFileSync(`/proc/${g.identity.pid}/comm`, "utf8").trim() === "cairn-init", 10_000, "exec of the init");
    assert.equal(processStartTime(g.identity.pid), g.identity.start_time);
    await waitFor(() => liveGroupMembers(g.identity.pgid).some((pid) => pid !== g.identity.pid && readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "sleep"), 10_000, "the command in the gate's group");
    await g.stop("cancelled");
    const outcome = await g.done;
    assert.equal(outcome.result, "cancelled");
    assert.equal(outcome.signal, "SIGTERM");
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);
  });
});

describe("cmd cells", () => {
  test("exit 0 is success with output captured", async () => {
    const s = spec({ kind: "cmd", argv: ["sh", "-c", "echo out; echo err >&2"] });
    const outcome = await run(s);
    assert.deepEqual({ ...outcome, duration_ms: 0 }, {
      result: "success", exit_code: 0, signal: null, duration_ms: 0, output_bytes: 8, dropped_bytes: 0, detail: null,
    });
    assert.equal(s.out.text("stdout"), "out\n");
    assert.equal(s.out.text("stderr"), "err\n");
  });

  test("non-zero exit and death by signal are errors", async () => {
    const failed = await run(spec({ kind: "cmd", argv: ["sh", "-c", "exit 3"] }));
    assert.equal(failed.result, "error");
    assert.equal(failed.exit_code, 3);
    assert.equal(failed.detail, "exited with code 3");
    const killed = await run(spec({ kind: "cmd", argv: ["sh", "-c", "kill -KILL $$"] }));
    assert.equal(killed.result, "error");
    assert.equal(killed.exit_code, null);
    assert.equal(killed.signal, "SIGKILL");
  });

  test("a missing command is an error that names it", async () => {
    const p = await executor.prepare(spec({ kind: "cmd", argv: ["cairn-no-such-command-xyz", "a"] }));
    assert.equal(p.kind, "unlaunchable");
    assert.equal(p.kind === "unlaunchable" && p.outcome.result, "error");
    assert.match(p.kind === "unlaunchable" ? p.outcome.detail ?? "" : "", /^no such command: cairn-no-such-command-xyz/);
    const rel = await executor.prepare(spec({ kind: "cmd", argv: ["./nope.sh"] }));
    assert.match(rel.kind === "unlaunchable" ? rel.outcome.detail ?? "" : "", /^no such command: \.\/nope\.sh/);
  });

  test("no shell: argv is passed literally", async () => {
    const s = spec({ kind: "cmd", argv: ["echo", "$HOME;", "rm -rf x", "`id`"] });
    const outcome = await run(s);
    assert.equal(outcome.result, "success");
    assert.equal(s.out.text("stdout"), "$HOME; rm -rf x `id`\n");
  });

  test("cwd and extra env reach the cell; stdin is empty", async () => {
    const s = spec({ kind: "cmd", argv: ["sh", "-c", 'pwd; echo "$CAIRN_TEST_VAR"; cat; echo end'] }, { env: { CAIRN_TEST_VAR: "v1" } });
    await run(s);
    assert.equal(s.out.text("stdout"), `${tmp.dir}\nv1\nend\n`);
  });

  test("background processes left in the group are stopped when the leader exits", async () => {
    const pidFile = join(tmp.dir, "bg.pid");
    const s = spec({ kind: "cmd", argv: ["sh", "-c", `sleep 60 & echo $! > ${pidFile}; echo started`] });
    const outcome = await run(s);
    assert.equal(outcome.result, "success");
    assert.match(outcome.detail ?? "", /1 process\(es\) it left running in its process group were stopped/);
    assert.equal(isAlive(Number(readFileSync(pidFile, "utf8"))), false);
    assert.equal(s.out.text("stdout"), "started\n");
  });
});

describe("script cells", () => {
  test("without uv, a script with no dependencies runs with python3 from a 0600 file", async () => {
    const source = '# /// script\n# requires-python = ">=3"\n# dependencies = []\n# ///\nimport sys\nprint("hi", sys.argv[0].endswith(".py"))\n';
    const s = spec({ kind: "script", source });
    const outcome = await run(s);
    assert.equal(outcome.result, "success", s.out.text("stderr"));
    assert.equal(s.out.text("stdout"), "hi True\n");
    const files = readdirSync(s.scriptDir).filter((f) => f.startsWith(`cell-${s.cellId}-`));
    assert.equal(files.length, 1, "one file of its own for this launch");
    const file = join(s.scriptDir, files[0]!);
    assert.match(files[0]!, /^cell-\d+-[0-9a-f]{12}\.py$/);
    assert.equal(readFileSync(file, "utf8"), source);
    assert.equal(statSync(file).mode & 0o777, 0o600);
    assert.equal(statSync(s.scriptDir).mode & 0o777, 0o700);
  });

  test("a script declaring dependencies with no uv is unlaunchable, and says how to get uv", async () => {
    const p = await executor.prepare(spec({ kind: "script", source: '# /// script\n# dependencies = ["httpx==0.28.1"]\n# ///\nimport httpx\n' }));
    assert.equal(p.kind, "unlaunchable");
    if (p.kind !== "unlaunchable") return;
    assert.equal(p.outcome.result, "error");
    assert.match(p.outcome.detail ?? "", /httpx==0\.28\.1/);
    assert.match(p.outcome.detail ?? "", /uv is needed/);
    assert.match(p.outcome.detail ?? "", /https:\/\/docs\.astral\.sh\/uv\//);
    assert.match(p.outcome.detail ?? "", /pipx install uv/);
  });

  test("requires-python that python3 does not satisfy is unlaunchable", async () => {
    const p = await executor.prepare(spec({ kind: "script", source: '# /// script\n# requires-python = ">=99"\n# ///\nprint(1)\n' }));
    assert.equal(p.kind, "unlaunchable");
    assert.match(p.kind === "unlaunchable" ? p.outcome.detail ?? "" : "", /requires-python ">=99" but python3 is \d+\.\d+/);
  });

  test("with uv on PATH the script runs as `uv run --script FILE`", async () => {
    const fakeUv = join(tmp.dir, "fake-uv");
    writeFileSync(fakeUv, '#!/bin/sh\necho "$@"\n', { mode: 0o755 });
    const ex = createExecutor({ which: (cmd) => (cmd === "uv" ? fakeUv : which(cmd)) });
    const s = spec({ kind: "script", source: '# /// script\n# dependencies = ["rich"]\n# ///\nprint(1)\n' });
    const outcome = await run(s, ex);
    assert.equal(outcome.result, "success");
    assert.match(s.out.text("stdout"), new RegExp(`^run --script ${s.scriptDir}/cell-${s.cellId}-[0-9a-f]{12}\\.py\n$`));
  });
});

describe("output capture", () => {
  test("a slow printer's output arrives in several throttled flushes, never concurrently", async () => {
    const s = spec({ kind: "cmd", argv: ["sh", "-c", "for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done"] }, { flushIntervalMs: 50 });
    const outcome = await run(s);
    assert.equal(outcome.result, "success");
    assert.equal(s.out.text("stdout"), "1\n2\n3\n4\n5\n6\n");
    assert.ok(s.out.calls.length >= 3, `flushes: ${s.out.calls.length}`);
    assert.equal(s.out.maxConcurrent(), 1);
  });

  test("past the output limit the rest is dropped, counted and marked", async () => {
    const s = spec({ kind: "cmd", argv: ["sh", "-c", "i=0; while [ $i -lt 1000 ]; do echo 0123456789; i=$((i+1)); done"] }, { outputLimitBytes: 1000 });
    const outcome = await run(s);
    assert.equal(outcome.result, "success");
    assert.equal(outcome.output_bytes, 1000);
    assert.equal(outcome.dropped_bytes, 11_000 - 1000);
    assert.equal(s.out.text("stdout").length, 1000);
    const last = s.out.calls.flat().at(-1)!;
    assert.equal(last.stream, "stderr");
    assert.match(last.data, /\[cairn: output truncated after 1000 bytes; 10000 bytes dropped\]/);
  });

  test("multi-byte characters split across writes and flushes arrive whole", async () => {
    // "€" is e2 82 ac; "𝄞" is f0 9d 84 9e. Each is written in two parts with a pause between.
    const s = spec({ kind: "cmd", argv: ["sh", "-c", "printf '\\342\\202'; sleep 0.2; printf '\\254|\\360\\235'; sleep 0.2; printf '\\204\\236\\n'"] }, { flushIntervalMs: 20 });
    const outcome = await run(s);
    assert.equal(outcome.result, "success");
    assert.equal(s.out.text("stdout"), "€|𝄞\n");
    assert.ok(!s.out.calls.flat().some((c) => c.data.includes("\uFFFD")));
    assert.ok(s.out.calls.length >= 2, "the halves were flushed separately");
  });
});

describe("limits and stopping", () => {
  test("the wall-time limit kills the cell and its grandchildren", async () => {
    const pidFile = join(tmp.dir, "grandchild.pid");
    const s = spec({ kind: "cmd", argv: ["sh", "-c", `sleep 60 & echo $! > ${pidFile}; sleep 60`] }, { wallTimeMs: 500 });
    const g = gated(await executor.prepare(s));
    g.release();
    const outcome = await g.done;
    assert.equal(outcome.result, "error");
    assert.equal(outcome.detail, "killed: wall-time limit of 0.5 s reached");
    assert.equal(outcome.signal, "SIGTERM");
    const grandchild = Number(readFileSync(pidFile, "utf8"));
    assert.equal(isAlive(grandchild), false, "the background sleep is gone");
    assert.equal(isAlive(g.identity.pid), false);
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);
  });

  test("a cell that ignores SIGTERM is SIGKILLed after the grace period", async () => {
    const s = spec({ kind: "cmd", argv: ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"] });
    const g = gated(await executor.prepare(s));
    g.release();
    await waitFor(() => s.out.text("stdout") === "ready\n", 10_000, "ready");
    await g.stop("cancelled");
    const outcome = await g.done;
    assert.equal(outcome.result, "cancelled");
    assert.equal(outcome.signal, "SIGKILL");
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);
  });

  test("stop('shutdown') kills the group and says so", async () => {
    const g = gated(await executor.prepare(spec({ kind: "cmd", argv: ["sleep", "60"] })));
    g.release();
    await g.stop("shutdown");
    const outcome = await g.done;
    assert.equal(outcome.result, "cancelled");
    assert.match(outcome.detail ?? "", /shutdown/);
    assert.equal(isAlive(g.identity.pid), false);
  });

  test("an onOutput failure rejects done with that error", async () => {
    const boom = new Error("fenced");
    const s = spec({ kind: "cmd", argv: ["echo", "x"] }, { onOutput: async () => Promise.reject(boom) });
    const g = gated(await executor.prepare(s));
    g.release();
    await assert.rejects(g.done, (err) => err === boom);
  });
});

describe("cell environment", () => {
  test("comes from an allow-list: a secret whose name nobody listed never reaches a cell; a variable the operator names does", async () => {
    const { cellEnvironment } = await import("../../src/exec/environment.js");
    const host = { PATH: "/bin", LANG: "C.UTF-8", LC_ALL: "C", TZ: "UTC", ANTHROPIC_API_KEY: "sk-secret", OPENAI_API_KEY: "k", CAIRN_ETCD_PASSWORD: "p", GITHUB_TOKEN: "mine", AWS_SECRET_ACCESS_KEY: "aws", CAIRN_UI_TOKEN: "ui", GIT_AUTHOR_NAME: "me" };
    assert.deepEqual(cellEnvironment(host, [], { CAIRN_SESSION: "s1" }), { PATH: "/bin", LANG: "C.UTF-8", LC_ALL: "C", TZ: "UTC", CAIRN_SESSION: "s1" });
    assert.deepEqual(cellEnvironment(host, ["GIT_AUTHOR_NAME", "NOT_SET"], {}), { PATH: "/bin", LANG: "C.UTF-8", LC_ALL: "C", TZ: "UTC", GIT_AUTHOR_NAME: "me" });
  });
});
