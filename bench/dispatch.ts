/**
 * Dispatch overhead of the executor: how long from "launch this cell" to the cell's first output byte,
 * through the gated launch (prepare: resolve + spawn the gate + read /proc; release: write "go"; the
 * gate execs the argv), against a plain execa spawn of the same command.
 *
 * Run: node --import tsx bench/dispatch.ts [launches=50]. Prints p50/p99 and ratios; asserts nothing.
 */
import { execa } from "execa";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createExecutor } from "../src/exec/executor.js";

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

function summary(name: string, samples: number[]): { p50: number; p99: number } {
  const sorted = [...samples].sort((a, b) => a - b);
  const p50 = percentile(sorted, 50);
  const p99 = percentile(sorted, 99);
  console.log(`${name.padEnd(44)} p50 ${p50.toFixed(2).padStart(8)} ms   p99 ${p99.toFixed(2).padStart(8)} ms   (n=${samples.length})`);
  return { p50, p99 };
}

/** Runs the benchmark and prints the results. */
export async function runDispatchBench(launches = 50): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-dispatch-"));
  const executor = createExecutor();
  const argv = ["echo", "x"];
  const gatedTotal: number[] = [];
  const gatedPrepare: number[] = [];
  const gatedRelease: number[] = [];
  const plain: number[] = [];
  try {
    for (let i = 0; i < launches + 3; i++) {
      const warmup = i < 3;
      // Gated: prepare + release, then the first output reaching onOutput (no throttle delay).
      let firstOutput: () => void = () => undefined;
      const first = new Promise<number>((resolve) => (firstOutput = () => resolve(performance.now())));
      const t0 = performance.now();
      const prepared = await executor.prepare({
        cellId: i,
        cell: { kind: "cmd", argv },
        cwd: dir,
        scriptDir: join(dir, "scripts"),
        wallTimeMs: 60_000,
        outputLimitBytes: 1 << 20,
        flushIntervalMs: 0,
        onOutput: async () => firstOutput(),
      });
      if (prepared.kind !== "gated") throw new Error(`unlaunchable: ${prepared.outcome.detail}`);
      const t1 = performance.now();
      prepared.release();
      const t2 = await first;
      await prepared.done;
      if (!warmup) {
        gatedTotal.push(t2 - t0);
        gatedPrepare.push(t1 - t0);
        gatedRelease.push(t2 - t1);
      }

      // Baseline: execa spawn of the same command to its first stdout byte.
      const s0 = performance.now();
      const child = execa(argv[0]!, argv.slice(1), { buffer: false, cwd: dir, stdin: "ignore" });
      const s1 = await new Promise<number>((resolve) => child.stdout!.once("data", () => resolve(performance.now())));
      await child;
      if (!warmup) plain.push(s1 - s0);
    }
    console.log(`dispatch: ${launches} launches of \`${argv.join(" ")}\` to the first output byte`);
    const total = summary("gated: prepare() + release() -> first byte", gatedTotal);
    summary("  of which prepare() (spawn gate, /proc)", gatedPrepare);
    summary("  of which release() -> first byte", gatedRelease);
    const base = summary("baseline: execa spawn -> first byte", plain);
    console.log(`ratio gated/baseline: p50 ${(total.p50 / base.p50).toFixed(2)}x   p99 ${(total.p99 / base.p99).toFixed(2)}x`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const n = Number(process.argv[2] ?? 50);
  await runDispatchBench(Number.isInteger(n) && n > 0 ? n : 50);
}
