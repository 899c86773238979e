/**
 * The native launcher's fallback when it cannot read the gate's /proc entry: its S answer then says
 * "- -" instead of the gate's pgid and start time (native/launcher.c), and the harness reads /proc
 * itself (src/exec/executor.ts). Shown with a real launcher that runs in a mount namespace of its own
 * whose /proc is an empty tmpfs (`unshare --mount`, as root), so that its read fails while this
 * process's /proc still shows the gate (same pid namespace). Skipped, with the reason, where a mount
 * namespace cannot be made (not root, no unshare).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createExecutor } from "../../src/exec/executor.js";
import { createNativeLauncher, nativeLauncherPath } from "../../src/exec/launcher.js";
import { readProcStat } from "../../src/exec/procfs.js";
import { collector, killGroupQuietly, tempDir } from "./helpers.js";

const tmp = tempDir("cairn-launcher-noproc-");
const groups: number[] = [];
after(() => {
  for (const g of groups) killGroupQuietly(g);
  tmp.remove();
});

const launcherPath = nativeLauncherPath();
const HIDE_PROC = "mount -t tmpfs cairn-no-proc /proc";

/** Why this file cannot run here, or null. */
function cannotRun(): string | null {
  if (process.env["CAIRN_LAUNCHER"] === "node") return "CAIRN_LAUNCHER=node: Node's spawn was asked for";
  if (launcherPath === null) return "build/cairn-launcher is not built";
  const probe = spawnSync("unshare", ["--mount", "--propagation", "private", "sh", "-c", `${HIDE_PROC} && test ! -e /proc/self/stat`], { encoding: "utf8" });
  if (probe.error !== undefined || probe.status !== 0) return `no mount namespace with /proc hidden can be made here (needs root and unshare): ${probe.error?.message ?? probe.stderr.trim()}`;
  // The wrapper is a script in the temporary directory: it must be allowed to run from there.
  const script = join(tmp.dir, "exec-probe");
  writeFileSync(script, "#!/bin/sh\nexit 0\n", { mode: 0o755 });
  const ran = spawnSync(script);
  if (ran.error !== undefined || ran.status !== 0) return `a script in ${tmp.dir} cannot be run (a noexec mount?): ${ran.error?.message ?? `exit ${ran.status}`}`;
  return null;
}

/** `s` as one single-quoted sh word. */
function shellQuote(s: string): string {
  return `'${s.replace(/'/g, "'\\''")}'`;
}

/** A launcher "binary" that runs the real one with /proc hidden from it. */
function hiddenProcLauncher(): string {
  const wrapper = join(tmp.dir, "launcher-without-proc");
  writeFileSync(wrapper, `#!/bin/sh\nexec unshare --mount --propagation private sh -c '${HIDE_PROC} && exec "$0" "$@"' ${shellQuote(launcherPath ?? "")} "$@"\n`, { mode: 0o755 });
  return wrapper;
}

describe("the launcher cannot read the gate's /proc entry", { skip: cannotRun() ?? false }, () => {
  test("its answer carries no identity, and the executor reads it from /proc itself: the same pgid and start time", async () => {
    const launcher = createNativeLauncher(hiddenProcLauncher());
    const r = await launcher.start({ argv: ["true"], cwd: tmp.dir, env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" } });
    assert.ok(r.ok, `started: ${r.ok ? "" : r.error.message}`);
    groups.push(r.gate.pid);
    assert.equal(r.gate.stat, undefined, 'the S answer was "- -": the launcher could not read /proc');
    r.gate.stdout.resume();
    r.gate.stderr.resume();
    r.gate.stdin.end("go\n");
    assert.deepEqual(await r.gate.exited, { code: 0, signal: null });

    // Through the executor: the identity comes from this process's /proc, and the cell runs once released.
    const ex = createExecutor({ launcher, killGraceMs: 200 });
    const out = collector();
    const p = await ex.prepare({ cellId: 1, cell: { kind: "cmd", argv: ["sh", "-c", "echo ran"] }, cwd: tmp.dir, scriptDir: join(tmp.dir, "scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 20, onOutput: out.onOutput });
    if (p.kind !== "gated") assert.fail(`expected a gated launch, got: ${p.outcome.detail}`);
    groups.push(p.identity.pgid);
    const proc = readProcStat(p.identity.pid);
    assert.ok(proc !== null, "the gate is alive, waiting for its release");
    assert.equal(p.identity.pgid, p.identity.pid);
    assert.equal(proc.pgid, p.identity.pid, "the gate leads its own group");
    assert.equal(p.identity.start_time, proc.startTime, "the start time is the one /proc shows");
    p.release();
    const outcome = await p.done;
    assert.equal(outcome.result, "success", outcome.detail ?? "");
    assert.match(out.text("stdout"), /ran/);
  });
});
