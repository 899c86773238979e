/**
 * The native cell launcher (native/launcher.c, src/exec/launcher.ts) against real processes: it is
 * what this checkout uses, the gates are its children and not the harness's, concurrent launches get
 * their own streams, strangers on its socket are turned away, and its own death (SIGKILL) or the
 * harness's never runs a gate that was not released nor loses track of a cell silently.
 */
import assert from "node:assert/strict";
import { execa } from "execa";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createExecutor, type GatedLaunch, type LaunchSpec, type Prepared } from "../../src/exec/executor.js";
import { createNativeLauncher, decodeWaitStatus, gateLauncher, nativeLauncherPath } from "../../src/exec/launcher.js";
import { liveGroupMembers, readProcStat } from "../../src/exec/procfs.js";
import { closedAfterWriting, collector, comm, isAlive, killGroupQuietly, tempDir, waitFor } from "./helpers.js";

const tmp = tempDir("cairn-launcher-");
const groups: number[] = [];
after(() => {
  for (const g of groups) killGroupQuietly(g);
  tmp.remove();
});

const path = nativeLauncherPath();

let nextCell = 1;
function spec(argv: string[], extra: Partial<LaunchSpec> = {}): LaunchSpec & { out: ReturnType<typeof collector> } {
  const out = collector();
  return { cellId: nextCell++, cell: { kind: "cmd", argv }, cwd: tmp.dir, scriptDir: join(tmp.dir, "scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 20, onOutput: out.onOutput, out, ...extra };
}

function gated(p: Prepared): GatedLaunch {
  if (p.kind !== "gated") assert.fail(`expected a gated launch, got unlaunchable: ${p.outcome.detail}`);
  groups.push(p.identity.pgid);
  return p;
}


describe("the native launcher", () => {
  test("this checkout built it, and it is the launcher this process uses", () => {
    assert.ok(path !== null && existsSync(path), "build/cairn-launcher exists (npm install builds it; `node scripts/build-launcher.mjs` by hand)");
    assert.ok(gateLauncher() === gateLauncher(), "one launcher per process");
  });

  test("the gate is the launcher's child, not a fork of this process, and keeps pid = pgid = session", async () => {
    const ex = createExecutor({ killGraceMs: 200 });
    const g = gated(await ex.prepare(spec(["true"])));
    const stat = readProcStat(g.identity.pid);
    assert.ok(stat !== null);
    assert.notEqual(stat.ppid, process.pid, "this process did not fork the gate");
    assert.equal(comm(stat.ppid), "cairn-launcher");
    assert.equal(stat.pgid, g.identity.pid);
    assert.equal(stat.sid, g.identity.pid);
    g.release();
    const outcome = await g.done;
    assert.equal(outcome.result, "success");
  });

  test("the launcher reports the gate's identity (pgid and start time) exactly as /proc has it", async () => {
    assert.ok(path !== null);
    const launcher = createNativeLauncher(path);
    // A program whose name holds spaces and parentheses: the gate's command name is the launcher's
    // until exec, but the parse must count fields after the last ')' whatever the name.
    const odd = join(tmp.dir, "a b) (c");
    writeFileSync(odd, "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    for (const argv of [["true"], [odd]]) {
      const r = await launcher.start({ argv, cwd: tmp.dir, env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" } });
      assert.ok(r.ok, "started");
      const gate = r.gate;
      groups.push(gate.pid);
      const proc = readProcStat(gate.pid);
      assert.ok(proc !== null && gate.stat !== undefined, "the S answer carried the identity");
      assert.deepEqual(gate.stat, { pgid: proc.pgid, startTime: proc.startTime });
      assert.equal(gate.stat.pgid, gate.pid, "pgid = pid: read after the gate's setsid");
      gate.stdout.resume();
      gate.stderr.resume();
      gate.stdin.end("go\n");
      assert.deepEqual(await gate.exited, { code: 0, signal: null });
    }
  });

  test("the exit report says whether the gate's group was empty at the reap; a group with a process left is still stopped", async () => {
    assert.ok(path !== null);
    const launcher = createNativeLauncher(path);
    const run = async (argv: string[]) => {
      const r = await launcher.start({ argv, cwd: tmp.dir, env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" } });
      assert.ok(r.ok, "started");
      groups.push(r.gate.pid);
      r.gate.stdout.resume();
      r.gate.stderr.resume();
      r.gate.stdin.end("go\n");
      const exit = await r.gate.exited;
      return { pid: r.gate.pid, exit, empty: r.gate.groupEmptyAtExit?.() };
    };
    const alone = await run(["true"]);
    assert.deepEqual(alone, { pid: alone.pid, exit: { code: 0, signal: null }, empty: true });
    const left = await run(["sh", "-c", "sleep 30 </dev/null >/dev/null 2>&1 & exit 3"]);
    assert.deepEqual(left, { pid: left.pid, exit: { code: 3, signal: null }, empty: false }, "a member was left: not reported empty");
    assert.equal(liveGroupMembers(left.pid).length, 1, "the sleep is still in the group");
    killGroupQuietly(left.pid);
    // Through the executor: the leftover is found and stopped, as before.
    const ex = createExecutor({ killGraceMs: 200, launcher });
    const g = gated(await ex.prepare(spec(["sh", "-c", "sleep 30 </dev/null >/dev/null 2>&1 & exit 0"])));
    g.release();
    const outcome = await g.done;
    assert.match(outcome.detail ?? "", /1 process\(es\) it left running in its process group were stopped/);
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);
  });

  test("64 launches at once: each gate gets its own streams and its own exit", async () => {
    const ex = createExecutor({ killGraceMs: 200 });
    const specs = Array.from({ length: 64 }, (_, i) => spec(["sh", "-c", `echo out-${i}; echo err-${i} >&2; exit ${i % 7}`]));
    const launches = (await Promise.all(specs.map((s) => ex.prepare(s)))).map(gated);
    assert.equal(new Set(launches.map((g) => g.identity.pid)).size, 64);
    for (const g of launches) g.release();
    const outcomes = await Promise.all(launches.map((g) => g.done));
    outcomes.forEach((o, i) => {
      assert.equal(o.exit_code, i % 7, `cell ${i}'s own exit code`);
      assert.equal(specs[i]?.out.text("stdout"), `out-${i}\n`);
      assert.equal(specs[i]?.out.text("stderr"), `err-${i}\n`);
    });
  });

  test("a connection to its socket with an unknown token is closed, and launches go on", async () => {
    const ex = createExecutor({ killGraceMs: 200 });
    const g = gated(await ex.prepare(spec(["true"])));
    const launcherPid = readProcStat(g.identity.pid)?.ppid ?? 0;
    const name = readFileSync(`/proc/${launcherPid}/cmdline`, "utf8").split("\0")[1] ?? "";
    assert.match(name, /\/cairn-launcher-[A-Za-z0-9]{6}\/s$/);
    const closed = await closedAfterWriting(name, `${"0".repeat(32)} 1\n`);
    assert.ok(closed, "the stranger's connection was closed");
    g.release();
    assert.equal((await g.done).result, "success");
    const s2 = spec(["echo", "still fine"]);
    const g2 = gated(await ex.prepare(s2));
    g2.release();
    assert.equal((await g2.done).result, "success");
    assert.equal(s2.out.text("stdout"), "still fine\n");
  });

  test("a connection that never sends its tag is closed after the unpaired timeout (a stranger cannot hold the harness's fds)", async () => {
    assert.ok(path !== null);
    const launcher = createNativeLauncher(path, { unpairedTimeoutMs: 300 });
    const ex = createExecutor({ killGraceMs: 200, launcher });
    const g = gated(await ex.prepare(spec(["true"])));
    const launcherPid = readProcStat(g.identity.pid)?.ppid ?? 0;
    const name = readFileSync(`/proc/${launcherPid}/cmdline`, "utf8").split("\0")[1] ?? "";
    const closed = await closedAfterWriting(name, "0123"); // part of a tag, never the newline
    assert.ok(closed, "the silent connection was closed");
    g.release();
    assert.equal((await g.done).result, "success");
  });

  test("a cell that stops its init and its launcher (kill -STOP $PPID and its parent, without a sandbox) wedges nothing: both are continued, the next launch starts and exits are reported", { timeout: 180_000 }, async () => {
    assert.ok(path !== null);
    const ex = createExecutor({ killGraceMs: 200, launcher: createNativeLauncher(path) });
    const stopper = spec(["/bin/sh", "-c", "launcher=$(cut -d' ' -f4 /proc/$PPID/stat); kill -STOP $PPID $launcher; echo stopped them"]);
    const g = gated(await ex.prepare(stopper));
    const launcherPid = readProcStat(g.identity.pid)?.ppid ?? 0;
    g.release();
    await waitFor(() => stopper.out.text("stdout") === "stopped them\n", 120_000, "the cell to stop its init and launcher");
    // Launched while the launcher may still be stopped: started all the same, nobody sent SIGCONT but Cairn.
    const next = spec(["echo", "after"]);
    const g2 = gated(await ex.prepare(next));
    assert.equal(readProcStat(g2.identity.pid)?.ppid, launcherPid, "the same launcher, continued");
    g2.release();
    assert.equal((await g2.done).result, "success");
    assert.equal((await g.done).result, "success", "the stopping cell's own exit was reported");
    assert.equal(next.out.text("stdout"), "after\n");
  });

  test("SIGKILL of the launcher while a cell runs: the cell runs to its end, its outcome says the status is unknown, the next launch starts a new launcher", async () => {
    assert.ok(path !== null);
    const ex = createExecutor({ killGraceMs: 200, launcher: createNativeLauncher(path) });
    const s = spec(["sh", "-c", "sleep 0.5; echo finished"]);
    const g = gated(await ex.prepare(s));
    const launcherPid = readProcStat(g.identity.pid)?.ppid ?? 0;
    assert.equal(comm(launcherPid), "cairn-launcher");
    g.release();
    process.kill(launcherPid, "SIGKILL");
    const outcome = await g.done;
    assert.equal(outcome.result, "error");
    assert.match(outcome.detail ?? "", /exit status is unknown: the cell launcher \(pid \d+\) that started it was killed by SIGKILL/);
    assert.equal(s.out.text("stdout"), "finished\n", "the cell was not stopped: it ran to its end and its output was captured");
    assert.deepEqual(liveGroupMembers(g.identity.pgid), []);

    const s2 = spec(["echo", "again"]);
    const g2 = gated(await ex.prepare(s2));
    const second = readProcStat(g2.identity.pid)?.ppid ?? 0;
    assert.notEqual(second, launcherPid);
    assert.equal(comm(second), "cairn-launcher");
    g2.release();
    assert.equal((await g2.done).result, "success");
    assert.equal(s2.out.text("stdout"), "again\n");
  });

  test("the gate is the launcher's own child, no shell: it shows as cairn-gate, runs only on \"go\", and an exec that fails after release says why, with sh's exit codes", async () => {
    assert.ok(path !== null);
    const launcher = createNativeLauncher(path);
    const start = async (argv: string[]) => {
      const r = await launcher.start({ argv, cwd: tmp.dir, env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" } });
      if (!r.ok) assert.fail(`launch of ${argv[0]} refused: ${r.error.message}`);
      groups.push(r.gate.pid);
      let err = "";
      let out = "";
      r.gate.stderr.setEncoding("utf8");
      r.gate.stderr.on("data", (c: string) => (err += c));
      r.gate.stdout.setEncoding("utf8");
      r.gate.stdout.on("data", (c: string) => (out += c));
      r.gate.stderr.resume();
      r.gate.stdout.resume();
      return { gate: r.gate, stderr: () => err, stdout: () => out };
    };
    const marker = join(tmp.dir, "touched-by-a-wrong-word");

    const waiting = await start(["touch", marker]);
    assert.equal(comm(waiting.gate.pid), "cairn-gate");
    assert.match(readFileSync(`/proc/${waiting.gate.pid}/cmdline`, "utf8"), /^cairn-gate\0touch\0/);
    assert.equal(readProcStat(waiting.gate.pid)?.pgid, waiting.gate.pid);
    waiting.gate.stdin.end("gone\n"); // not the word
    assert.deepEqual(await waiting.gate.exited, { code: 125, signal: null });
    assert.equal(existsSync(marker), false, "nothing ran without \"go\"");

    const missing = await start(["/nonexistent/program", "x"]);
    missing.gate.stdin.end("go\n");
    assert.deepEqual(await missing.gate.exited, { code: 127, signal: null });
    await waitFor(() => missing.stderr().length > 0, 120_000, "the gate's sentence on stderr");
    assert.equal(missing.stderr(), "cairn-gate: /nonexistent/program: No such file or directory\n");

    const notExecutable = join(tmp.dir, "plain-file");
    writeFileSync(notExecutable, "echo no\n", { mode: 0o644 });
    const denied = await start([notExecutable]);
    denied.gate.stdin.end("go\n");
    assert.deepEqual(await denied.gate.exited, { code: 126, signal: null });

    // Found through the cell's own PATH, as sh's `exec` would.
    const viaPath = await start(["echo", "found"]);
    viaPath.gate.stdin.end("go\n");
    assert.deepEqual(await viaPath.gate.exited, { code: 0, signal: null });
    await waitFor(() => viaPath.stdout() === "found\n", 120_000, "the cell's output");

    // An argument over the kernel's limit for one string (128 KiB) is refused before anything starts.
    const huge = await launcher.start({ argv: ["echo", "x".repeat(200 * 1024)], cwd: tmp.dir, env: {} });
    assert.equal(huge.ok, false);
    if (!huge.ok) assert.equal(huge.error.code, "E2BIG");
  });

  test("SIGKILL of the launcher before release: the gate can still be released, and runs", async () => {
    assert.ok(path !== null);
    const ex = createExecutor({ killGraceMs: 200, launcher: createNativeLauncher(path) });
    const s = spec(["echo", "released after the launcher died"]);
    const g = gated(await ex.prepare(s));
    const launcherPid = readProcStat(g.identity.pid)?.ppid ?? 0;
    process.kill(launcherPid, "SIGKILL");
    await waitFor(() => !isAlive(launcherPid), 120_000, "the launcher to die");
    g.release();
    const outcome = await g.done;
    assert.equal(s.out.text("stdout"), "released after the launcher died\n");
    assert.match(outcome.detail ?? "", /exit status is unknown/);
  });

  test("when the process that started it dies, the launcher exits, an unreleased gate runs nothing, and a released cell runs on", async () => {
    const marker = join(tmp.dir, "never-touched");
    const ran = join(tmp.dir, "ran-after-crash");
    const executorUrl = new URL("../../src/exec/executor.ts", import.meta.url).href;
    const script = `
      import { createExecutor } from ${JSON.stringify(executorUrl)};
      import { readFileSync } from "node:fs";
      const ex = createExecutor();
      const base = { cwd: ${JSON.stringify(tmp.dir)}, scriptDir: ${JSON.stringify(tmp.dir)}, wallTimeMs: 60000, outputLimitBytes: 1000, onOutput: async () => {} };
      const held = await ex.prepare({ ...base, cellId: 1, cell: { kind: "cmd", argv: ["touch", ${JSON.stringify(marker)}] } });
      const free = await ex.prepare({ ...base, cellId: 2, cell: { kind: "cmd", argv: ["sh", "-c", "sleep 1; touch ${ran}"] } });
      free.release();
      const launcher = Number(readFileSync("/proc/" + held.identity.pid + "/stat", "utf8").split(") ")[1].split(" ")[1]);
      console.log(JSON.stringify({ held: held.identity, free: free.identity, launcher }));
      process.kill(process.pid, "SIGKILL");
    `;
    const r = await execa(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { reject: false });
    assert.equal(r.signal, "SIGKILL", r.stderr);
    const ids = JSON.parse(r.stdout) as { held: { pid: number; pgid: number }; free: { pid: number; pgid: number }; launcher: number };
    groups.push(ids.held.pgid, ids.free.pgid);
    await waitFor(() => !isAlive(ids.launcher), 120_000, "the launcher to exit");
    await waitFor(() => !isAlive(ids.held.pid), 120_000, "the unreleased gate to exit");
    assert.equal(existsSync(marker), false, "the unreleased cell never ran");
    await waitFor(() => existsSync(ran), 120_000, "the released cell to finish on its own");
  });

  test("a process whose cells have ended exits on its own: the launcher does not hold its event loop", async () => {
    const executorUrl = new URL("../../src/exec/executor.ts", import.meta.url).href;
    const script = `
      import { createExecutor } from ${JSON.stringify(executorUrl)};
      const ex = createExecutor();
      const p = await ex.prepare({ cellId: 1, cell: { kind: "cmd", argv: ["echo", "hi"] }, cwd: ${JSON.stringify(tmp.dir)},
        scriptDir: ${JSON.stringify(tmp.dir)}, wallTimeMs: 60000, outputLimitBytes: 1000, onOutput: async (c) => { process.stdout.write(c.map((x) => x.data).join("")); } });
      p.release();
      const o = await p.done;
      console.log(o.result);
    `;
    const r = await execa(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { reject: false, timeout: 180_000 });
    assert.equal(r.timedOut, false, "the process did not exit by itself");
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, "hi\nsuccess");
  });
});

describe("wait statuses", () => {
  test("decodes exits and deaths by signal as Node does", () => {
    assert.deepEqual(decodeWaitStatus(0), { code: 0, signal: null });
    assert.deepEqual(decodeWaitStatus(3 << 8), { code: 3, signal: null });
    assert.deepEqual(decodeWaitStatus(125 << 8), { code: 125, signal: null });
    assert.deepEqual(decodeWaitStatus(9), { code: null, signal: "SIGKILL" });
    assert.deepEqual(decodeWaitStatus(15 | 0x80), { code: null, signal: "SIGTERM" }, "a core dump flag does not change the signal");
  });
});
