import { test } from "node:test";
import assert from "node:assert/strict";
import { clockTicksPerSecond, measureIdle, readCpuTicks, runIdleBench } from "../../bench/idle.js";
import { spawn } from "node:child_process";
import { parseProcStat, startCpuWindow } from "../../bench/stats.js";

test("readCpuTicks agrees with process.cpuUsage() on this process", async () => {
  const hz = await clockTicksPerSecond();
  assert.ok(Number.isInteger(hz) && hz > 0);
  const ticks0 = await readCpuTicks(process.pid);
  const usage0 = process.cpuUsage();
  // Burn a fixed amount of CPU (not wall time), so the check does not depend on machine load.
  let spent = 0;
  let x = 0;
  while (spent < 300_000) {
    for (let i = 0; i < 100_000; i++) x += Math.sqrt(i);
    const u = process.cpuUsage(usage0);
    spent = u.user + u.system;
  }
  assert.ok(x > 0);
  const ticks1 = await readCpuTicks(process.pid);
  const usage = process.cpuUsage(usage0);
  const procSeconds = (ticks1 - ticks0) / hz;
  const nodeSeconds = (usage.user + usage.system) / 1e6;
  // /proc counts whole ticks (10 ms at 100 Hz): allow two ticks either way plus 10%.
  assert.ok(Math.abs(procSeconds - nodeSeconds) <= 2 / hz + nodeSeconds * 0.1, `/proc says ${procSeconds}s, cpuUsage ${nodeSeconds}s`);
});

test("readCpuTicks throws for a process that does not exist", async () => {
  await assert.rejects(readCpuTicks(2 ** 22 + 12345), /ENOENT/);
});

test("a sleeping process measures near 0% and a busy one clearly more; both are stopped by SIGTERM", async () => {
  const idle = await measureIdle({ command: ["sleep", "30"], ready: "started", seconds: 1 });
  const busy = await measureIdle({ command: [process.execPath, "-e", "for(;;){}"], ready: "started", seconds: 1 });
  assert.ok(idle.percentOfCore < 5, `sleep used ${idle.percentOfCore}% of a core`);
  assert.ok(busy.cpuSeconds > 0, "a busy loop must accumulate CPU ticks");
  assert.ok(busy.percentOfCore > idle.percentOfCore, `busy ${busy.percentOfCore}% vs idle ${idle.percentOfCore}%`);
  for (const r of [idle, busy]) {
    assert.equal(r.exitSignal, "SIGTERM");
    assert.equal(r.killed, false);
    assert.throws(() => process.kill(r.pid, 0), "the measured process is gone");
  }
});

test("readyz mode waits for the printed URL to answer 200 before measuring, and prints the report", async () => {
  // A stand-in for `cairn serve`: logs its URL like the observability server, is not ready at first.
  const fake = `
    const http = require("node:http");
    let ready = false;
    setTimeout(() => { ready = true; }, 600);
    const server = http.createServer((req, res) => { res.statusCode = req.url === "/readyz" && ready ? 200 : 503; res.end(ready ? "ok" : "starting"); });
    server.listen(0, "127.0.0.1", () => console.error(JSON.stringify({ msg: "observability endpoint listening", url: "http://127.0.0.1:" + server.address().port })));
    process.on("SIGTERM", () => { server.close(); process.exit(0); });`;
  const lines: string[] = [];
  await runIdleBench({ command: [process.execPath, "-e", fake], seconds: 1, print: (l) => lines.push(l) });
  const text = lines.join("\n");
  assert.match(text, /idle CPU: \d+\.\d{3}% of one core/);
  assert.match(text, /after SIGTERM: exit code 0/);
});

test("the default command (`cairn serve` on a new sqlite database) gets ready, is measured, and exits 0 on SIGTERM", async () => {
  // The default must pass --create: serve refuses a database that does not exist, and
  // `npm run bench -- idle` would fail at once.
  const r = await measureIdle({ seconds: 1, settleSeconds: 0 });
  assert.ok(r.wallSeconds >= 1, `measured ${r.wallSeconds}s`);
  assert.equal(r.exitCode, 0);
  assert.equal(r.killed, false);
});

test("a process that exits before it is ready fails with its output, and one that never prints a URL times out", async () => {
  await assert.rejects(
    measureIdle({ command: [process.execPath, "-e", "console.error('cairn: --db is required'); process.exit(2)"], seconds: 1 }),
    /exited before it was ready \(code 2[\s\S]*--db is required/,
  );
  await assert.rejects(measureIdle({ command: ["sleep", "30"], seconds: 1, readyTimeoutSeconds: 1 }), /not ready after 1s \(it printed no http:\/\/HOST:PORT\)/);
});

test("parseProcStat reads a name with spaces and parentheses, and refuses a line it cannot parse", () => {
  // Fields: pid (name) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
  const line = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 31 7 50 3 20 0 1 0 12345 1000 200";
  assert.deepEqual(parseProcStat(line), { name: "a (b) c", ppid: 17, own: 38, reaped: 53 });
  assert.throws(() => parseProcStat("not a stat line"), /cannot parse/);
});

test("startCpuWindow attributes a busy child's CPU to its name, a reaped child's to `reaped`, and the machine total covers both", async () => {
  const hz = await clockTicksPerSecond();
  const burn = (ms: number) => `const t = process.cpuUsage(); while ((process.cpuUsage(t).user + process.cpuUsage(t).system) < ${ms * 1000}) {}`;
  // A direct child that stays alive through the window (named "cairn-burner"): it burns once told to
  // on stdin, inside the window, and says when it is done. And a child reaped inside the window.
  const alive = spawn(process.execPath, ["-e", `process.title = "cairn-burner"; process.stdin.once("data", () => { ${burn(400)}; process.stdout.write("done"); }); setInterval(() => {}, 1000)`], { stdio: ["pipe", "pipe", "ignore"] });
  await new Promise((r) => setTimeout(r, 300)); // started and renamed before the window opens
  try {
    const end = startCpuWindow(hz);
    const done = new Promise((resolve) => alive.stdout.once("data", resolve));
    alive.stdin.write("go\n");
    await new Promise<void>((resolve, reject) => {
      const reaped = spawn(process.execPath, ["-e", burn(300)], { stdio: "ignore" });
      reaped.on("error", reject).on("exit", () => resolve());
    });
    await done;
    const m = end();
    assert.ok(m !== null, "/proc is readable here");
    const tick = 1000 / hz;
    assert.ok((m.ms["cairn-burner"] ?? 0) >= 400 - 2 * tick, `the live child's CPU: ${JSON.stringify(m.ms)}`);
    assert.ok((m.ms["reaped"] ?? 0) >= 300 - 2 * tick, `the reaped child's CPU: ${JSON.stringify(m.ms)}`);
    assert.ok(m.ms["machine"]! >= m.ms["cairn-burner"]! + m.ms["reaped"]! - 4 * tick, `the machine total covers both: ${JSON.stringify(m.ms)}`);
    assert.ok(m.cores >= 1);
  } finally {
    alive.kill("SIGKILL");
  }
});
