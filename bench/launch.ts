/**
 * Why cells start through the native launcher: the harness's CPU per launch and the wall time to the
 * cell's first byte, with a large heap (as a worker driving many runs has), through the launcher
 * (the executor's path) beside Node's own spawn of the very same command line (Node forks the whole
 * harness for each). Both launch the same sandbox when this machine builds one.
 *
 * Run: npm run bench -- launch (or node --import tsx bench/launch.ts [launches] [heapMiB]). Prints the
 * figures and their ratio, measured in one run; asserts nothing.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createExecutor, type CellBoundary } from "../src/exec/executor.js";
import { DEFAULT_CELL_LIMITS } from "../src/exec/cgroup.js";
import { nativeLauncherPath } from "../src/exec/launcher.js";
import { bwrapArgv, probeSandbox } from "../src/exec/sandbox.js";

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? Number.NaN;
}

const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

/** Keeps `mib` MiB of small objects alive, as a busy worker's heap would be. */
function ballast(mib: number): unknown[] {
  const keep: unknown[] = [];
  for (let i = 0; i < mib * 1024; i++) keep.push({ i, s: "x".repeat(900), a: [i, i + 1] });
  return keep;
}

export async function runLaunchBench(launches = 40, heapMiB = 300): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-launch-"));
  const keep = ballast(heapMiB);
  const probe = probeSandbox();
  const init = nativeLauncherPath();
  if (init === null) throw new Error("build/cairn-launcher is not built: run npm ci");
  const boundary: CellBoundary = {
    sandbox: probe.ok ? { kind: "bwrap", bwrap: probe.bwrap } : { kind: "none" },
    network: "off",
    hide: [],
    passEnv: [],
    limits: DEFAULT_CELL_LIMITS,
  };
  const argv = ["echo", "x"];
  const nodeArgv = probe.ok ? bwrapArgv({ bwrap: probe.bwrap, init, cwd: dir, network: "off", hide: [], binds: [], initArgs: [], argv }) : [init, "init", "--", ...argv];
  const executor = createExecutor({ cgroups: null });
  const native = { wall: [] as number[], cpu: 0 };
  const viaNode = { wall: [] as number[], cpu: 0 };
  try {
    for (let i = 0; i < launches + 5; i++) {
      const measured = i >= 5;
      let c0 = cpuMs();
      let t0 = performance.now();
      let first: (t: number) => void = () => undefined;
      const got = new Promise<number>((r) => (first = r));
      const p = await executor.prepare({ cellId: i + 1, cell: { kind: "cmd", argv }, cwd: dir, scriptDir: join(dir, "s"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 0, boundary, onOutput: async () => first(performance.now()) });
      if (p.kind !== "gated") throw new Error(`unlaunchable: ${p.outcome.detail}`);
      p.release();
      const t1 = await got;
      await p.done;
      if (measured) {
        native.wall.push(t1 - t0);
        native.cpu += cpuMs() - c0;
      }

      c0 = cpuMs();
      t0 = performance.now();
      const child = spawn(nodeArgv[0]!, nodeArgv.slice(1), { cwd: dir, stdio: ["ignore", "pipe", "ignore"] });
      const t2 = await new Promise<number>((r) => child.stdout.once("data", () => r(performance.now())));
      await new Promise((r) => child.once("exit", r));
      if (measured) {
        viaNode.wall.push(t2 - t0);
        viaNode.cpu += cpuMs() - c0;
      }
    }
    const heap = Math.round(process.memoryUsage().rss / 2 ** 20);
    console.log(`launch: ${launches} launches of \`${argv.join(" ")}\` ${probe.ok ? "in the bubblewrap sandbox" : "(no sandbox on this machine)"}, this process at ${heap} MiB resident`);
    console.log("path                               harness CPU ms/launch   wall to first byte p50 ms");
    const row = (name: string, r: { wall: number[]; cpu: number }) => console.log(`${name.padEnd(34)} ${(r.cpu / launches).toFixed(2).padStart(21)}   ${median(r.wall).toFixed(2).padStart(25)}`);
    row("native launcher (cells' path)", native);
    row("Node's spawn (forks the harness)", viaNode);
    console.log(`ratio Node's spawn / launcher: CPU ${(viaNode.cpu / native.cpu).toFixed(2)}x, wall ${(median(viaNode.wall) / median(native.wall)).toFixed(2)}x`);
  } finally {
    keep.length = 0;
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const n = Number(process.argv[2] ?? 40);
  const heap = Number(process.argv[3] ?? 300);
  await runLaunchBench(Number.isInteger(n) && n > 0 ? n : 40, Number.isFinite(heap) && heap >= 0 ? heap : 300);
}
