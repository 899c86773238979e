/**
 * The nemesis from the command line:
 *
 *   node --import tsx chaos/nemesis/main.ts --seed N [--minutes M] [--faults F] [--runs R] [--keep]
 *                                          [--only KIND,...] [--sqlite-only] [--host-per-worker]
 *                                          [--long-ms MS]
 *   npm run chaos -- --long            (the soak profile: 30 minutes, seed from the clock unless given)
 *
 * Prints the seed first, progress while it runs, then the summary (faults by kind, operations by
 * outcome, anomalies, recovery times). Exit code 0 when the checker found no anomaly, 1 when it did
 * (with the seed and the minimal history excerpt of each), 2 on bad usage. The working directory
 * (history.jsonl, final/, effects/) is kept when the check fails or with --keep. --host-per-worker
 * gives each worker a host name of its own (a UTS namespace, root only), as if each were a machine.
 * --long-ms sets how long a long-running cell runs (default 1500).
 */
import { parseArgs } from "node:util";
import { removeRun, runNemesis } from "./run.js";
import { FAULT_KINDS, type FaultKind } from "./schedule.js";

function usage(message: string): never {
  process.stderr.write(`nemesis: ${message}\nusage: node --import tsx chaos/nemesis/main.ts [--seed N] [--minutes M] [--faults F] [--runs R] [--long] [--keep] [--only KIND,...] [--sqlite-only] [--host-per-worker] [--long-ms MS]\n`);
  process.exit(2);
}

async function main(): Promise<number> {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      options: { seed: { type: "string" }, minutes: { type: "string" }, faults: { type: "string" }, runs: { type: "string" }, long: { type: "boolean" }, keep: { type: "boolean" }, only: { type: "string" }, "sqlite-only": { type: "boolean" }, "host-per-worker": { type: "boolean" }, "long-ms": { type: "string" } },
      strict: true,
    }));
  } catch (err) {
    usage((err as Error).message);
  }
  const num = (name: string, fallback: number, positive = true): number => {
    const v = values[name];
    if (v === undefined) return fallback;
    const n = Number(v);
    if (!Number.isFinite(n) || (positive && n <= 0) || n < 0) usage(`--${name} expects a ${positive ? "positive " : ""}number, got "${String(v)}"`);
    return n;
  };
  const seed = Math.floor(num("seed", Date.now() % 1_000_000, false));
  const minutes = num("minutes", values.long ? 30 : 2);
  const spanMs = Math.round(minutes * 60_000);
  // About 4 faults a second and a run every 2 seconds, unless told otherwise.
  const faults = Math.floor(num("faults", Math.max(1, Math.round(spanMs / 250))));
  const runs = Math.floor(num("runs", Math.max(2, Math.round(spanMs / 2000))));
  const longMs = Math.round(num("long-ms", 1500));
  let weights: Partial<Record<FaultKind, number>> | undefined;
  if (typeof values.only === "string") {
    weights = {};
    for (const k of values.only.split(",")) {
      if (!(FAULT_KINDS as readonly string[]).includes(k)) usage(`--only names no fault kind "${k}"; the kinds are ${FAULT_KINDS.join(", ")}`);
      weights[k as FaultKind] = 1;
    }
  }
  process.stdout.write(`nemesis: seed ${seed} (replay with --seed ${seed})\n`);
  const r = await runNemesis({ seed, faults, spanMs, runs, keep: values.keep === true, ...(weights ? { weights } : {}), ...(values["sqlite-only"] ? { replicated: false } : {}), ...(values["host-per-worker"] ? { hostPerWorker: true } : {}), longMs, log: (l) => process.stdout.write(`${l}\n`), settleLimitMs: Math.max(180_000, spanMs) });
  process.stdout.write(`${r.summary}\n`);
  if (r.failure !== "") {
    process.stdout.write(`${r.failure}\nthe history, final logs and effect files are in ${r.root}\n`);
    return 1;
  }
  if (values.keep) process.stdout.write(`kept ${r.root}\n`);
  else removeRun(r.root);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`nemesis: ${(err as Error)?.message ?? String(err)}\n`);
    process.exit(1);
  },
);
