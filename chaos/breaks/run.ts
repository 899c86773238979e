/**
 * Breaks the harness on purpose and shows that the nemesis catches each break:
 *
 *   node --import tsx chaos/breaks/run.ts [--seed N] [--control] [--keep] [--profile="ARGS"] [a b c d ...]
 *   npm run chaos:breaks -- [--seed N] [--control] [--keep] [--profile="ARGS"] [a b c d ...]
 *
 * For each break named (all four by default, see breaks.ts): a scratch copy of the repository's
 * tracked files (node_modules linked), the break's patch applied with `git apply`, the nemesis run
 * there with the break's profile and the seed (default 11), then the verdict: caught or not, and which
 * checks fired, how often, on which databases, with the first excerpt line of each. The counts come
 * from the checker run again over the kept history, final logs and effect files (the nemesis prints
 * only the first 20 anomalies). The scratch copy and the nemesis's working directory are removed
 * afterwards (kept with --keep). `--control` runs the same profiles on the unpatched copy, where the
 * checker must find nothing. `--profile` replaces the breaks' own nemesis arguments (to try another). Needs what the nemesis needs (root, iptables, etcd); a run takes a few
 * minutes. Exit code 0 when every break was caught (with --control: when no run found an anomaly),
 * 1 otherwise, 2 on bad usage. Not part of `npm test` (patches.test.ts only checks that the patches apply).
 */
import { spawn } from "node:child_process";
import { createWriteStream, existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { check, type Anomaly, type FinalEvent } from "../nemesis/checker.js";
import { parseHistory } from "../nemesis/history.js";
import { removeRun } from "../nemesis/run.js";
import { applyPatch, BREAKS, breakNamed, patchPath, removeScratch, REPO, scratchCopy, type Break } from "./breaks.js";

const HANG_GUARD_MS = 25 * 60_000;

interface Fired {
  count: number;
  readonly dbs: Map<string, number>;
  readonly first: Anomaly;
}

interface Outcome {
  readonly b: Break;
  readonly seed: number;
  readonly control: boolean;
  readonly exitCode: number | null;
  readonly seconds: number;
  readonly anomalies: number;
  readonly fired: Map<string, Fired>;
  /** What the nemesis said when it could not be read back (empty when it could). */
  readonly note: string;
  readonly summary: string;
  readonly log: string;
}

const out = (s: string) => process.stdout.write(`${s}\n`);

function usage(message: string): never {
  process.stderr.write(`chaos:breaks: ${message}\nusage: node --import tsx chaos/breaks/run.ts [--seed N] [--control] [--keep] [--profile="ARGS"] [${BREAKS.map((b) => b.id).join(" ")} ...]\n`);
  process.exit(2);
}

/** The floor main.ts gives the checker for these arguments (its defaults: 2 minutes, a run every 2 s). */
function floorOf(profile: readonly string[]): { ackedCommits: number; successfulRuns: number } {
  const arg = (name: string) => {
    const i = profile.indexOf(`--${name}`);
    return i >= 0 ? Number(profile[i + 1]) : undefined;
  };
  const spanMs = Math.round((arg("minutes") ?? 2) * 60_000);
  const runs = Math.floor(arg("runs") ?? Math.max(2, Math.round(spanMs / 2000)));
  return { ackedCommits: Math.max(20, runs * 4), successfulRuns: Math.ceil(runs / 2) };
}

/** Runs the checker again over a kept nemesis directory. */
function recheck(root: string, profile: readonly string[]): Anomaly[] {
  const history = parseHistory(readFileSync(join(root, "history.jsonl"), "utf8"));
  const finals = new Map<string, FinalEvent[]>();
  const effects = new Map<string, string[]>();
  for (const f of readdirSync(join(root, "final"))) {
    if (!f.endsWith(".jsonl")) continue;
    const db = f.slice(0, -".jsonl".length);
    finals.set(db, readFileSync(join(root, "final", f), "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as FinalEvent));
    const ef = join(root, "effects", `${db}.txt`);
    effects.set(db, existsSync(ef) ? readFileSync(ef, "utf8").split("\n") : []);
  }
  return check({ history, finals, effects, floor: floorOf(profile) }).anomalies;
}

/** What an interrupt must clean up. */
let current: { child: ReturnType<typeof spawn> | null; scratch: string | null; root: string | null } = { child: null, scratch: null, root: null };

async function runOne(b: Break, seed: number, control: boolean, keep: boolean): Promise<Outcome> {
  const t0 = Date.now();
  const scratch = scratchCopy();
  current = { child: null, scratch, root: null };
  const logFile = join(tmpdir(), `cairn-break-${control ? "control-" : ""}${b.id}-seed${seed}-${process.pid}.log`);
  try {
    if (!control) applyPatch(scratch, patchPath(b));
    const args = ["--import", "tsx", "chaos/nemesis/main.ts", "--seed", String(seed), ...b.profile, "--keep"];
    out(`[${b.id}] ${control ? "control (no patch)" : `break "${b.name}" applied`} in ${scratch}; nemesis ${args.slice(2).join(" ")}; full output in ${logFile}`);
    const log = createWriteStream(logFile);
    const child = spawn(process.execPath, args, { cwd: scratch, detached: true, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NODE_NO_WARNINGS: "1" } });
    current.child = child;
    let text = "";
    let partial = "";
    const onData = (d: Buffer) => {
      log.write(d);
      const s = partial + d.toString("utf8");
      const lines = s.split("\n");
      partial = lines.pop() ?? "";
      for (const l of lines) {
        text += `${l}\n`;
        const wd = /^nemesis: seed .*; working dir (\S+)$/.exec(l);
        if (wd !== null) current.root = wd[1]!;
        if (/^nemesis( seed|: (seed|fault phase|settled|the runs did not|\d+ anomalies))/.test(l)) out(`[${b.id}] ${l.slice(0, 240)}`);
      }
    };
    child.stdout!.on("data", onData);
    child.stderr!.on("data", (d: Buffer) => log.write(d));
    const guard = setTimeout(() => {
      out(`[${b.id}] the nemesis did not finish within ${HANG_GUARD_MS / 60_000} minutes: killing it`);
      try {
        process.kill(-child.pid!, "SIGKILL");
      } catch {
        // gone
      }
    }, HANG_GUARD_MS);
    const exitCode = await new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
    clearTimeout(guard);
    text += partial;
    await new Promise<void>((resolve) => log.end(() => resolve()));
    current.child = null;
    const m = /(?:^kept |the history, final logs and effect files are in )(\S+)$/m.exec(text);
    const summary = text.split("\n").filter((l) => /^(nemesis seed| {2}(faults by kind|commits|runs|worker exits|recovery))/.test(l)).join("\n");
    const fired = new Map<string, Fired>();
    let anomalies = 0;
    let note = "";
    if (m === null) {
      note = `the nemesis ended with exit code ${String(exitCode)} without a working directory to read (see ${logFile})`;
    } else {
      const root = m[1]!;
      try {
        const found = recheck(root, b.profile);
        anomalies = found.length;
        for (const a of found) {
          const f = fired.get(a.check) ?? { count: 0, dbs: new Map<string, number>(), first: a };
          f.count += 1;
          f.dbs.set(a.db, (f.dbs.get(a.db) ?? 0) + 1);
          fired.set(a.check, f);
        }
        const reported = /^nemesis: (\d+) anomalies/m.exec(text);
        if (reported !== null && Number(reported[1]) !== anomalies) note = `the nemesis reported ${reported[1]} anomalies, the re-check found ${anomalies}`;
      } finally {
        if (keep) out(`[${b.id}] kept the nemesis directory ${root}`);
        else removeRun(root);
      }
    }
    return { b, seed, control, exitCode, seconds: Math.round((Date.now() - t0) / 1000), anomalies, fired, note, summary, log: logFile };
  } finally {
    if (keep) out(`[${b.id}] kept the scratch copy ${scratch}`);
    else removeScratch(scratch);
    current = { child: null, scratch: null, root: null };
  }
}

function describe(o: Outcome): string[] {
  const lines: string[] = [];
  const caught = o.anomalies > 0;
  lines.push(`${o.control ? "control" : "break"} ${o.b.id} (${o.b.name}): seed ${o.seed}, profile ${o.b.profile.join(" ")}, ${o.seconds} s, nemesis exit code ${String(o.exitCode)}`);
  lines.push(`  ${o.control ? (caught ? "ANOMALIES WITHOUT THE BREAK" : "clean: no anomaly without the break") : caught ? "caught: yes" : "caught: NO"}${o.anomalies > 0 ? ` (${o.anomalies} anomalies)` : ""}`);
  for (const [check, f] of [...o.fired].sort((x, y) => y[1].count - x[1].count)) {
    lines.push(`  [${check}] x${f.count} (${[...f.dbs].map(([db, n]) => `${db} ${n}`).join(", ")})${o.b.expect.includes(check) ? " (expected)" : ""}`);
    lines.push(`    first: ${f.first.message}`);
    for (const x of f.first.excerpt.slice(0, 2)) lines.push(`    excerpt: ${x.slice(0, 300)}`);
  }
  if (o.note !== "") lines.push(`  note: ${o.note}`);
  for (const l of o.summary.split("\n")) if (l.trim() !== "") lines.push(`  | ${l.trim()}`);
  return lines;
}

async function main(): Promise<number> {
  let parsed: { values: Record<string, string | boolean | undefined>; positionals: string[] };
  try {
    parsed = parseArgs({ options: { seed: { type: "string" }, control: { type: "boolean" }, keep: { type: "boolean" }, profile: { type: "string" } }, allowPositionals: true, strict: true });
  } catch (err) {
    usage((err as Error).message);
  }
  const { values, positionals } = parsed;
  const seedText = typeof values.seed === "string" ? values.seed : "11";
  const seed = Number(seedText);
  if (!Number.isInteger(seed) || seed < 0) usage(`--seed expects a non-negative integer, got "${seedText}"`);
  let chosen: Break[];
  try {
    chosen = positionals.length === 0 ? [...BREAKS] : positionals.map((id) => breakNamed(id));
  } catch (err) {
    usage((err as Error).message);
  }
  const control = values.control === true;
  const keep = values.keep === true;
  if (typeof values.profile === "string") {
    const profile = values.profile.split(/\s+/).filter((a) => a !== "");
    if (profile.includes("--seed") || profile.includes("--keep")) usage("--profile must not hold --seed or --keep (the runner adds them)");
    chosen = chosen.map((b) => ({ ...b, profile }));
  }
  // Every patch must apply to the tree as it is before minutes go into the first run.
  if (!control) for (const b of chosen) applyPatch(REPO, patchPath(b), true);
  const outcomes: Outcome[] = [];
  for (const b of chosen) {
    const o = await runOne(b, seed, control, keep);
    outcomes.push(o);
    for (const l of describe(o)) out(l);
  }
  out("");
  out("| break | seed | profile | caught | checks fired (count) | time |");
  out("|---|---|---|---|---|---|");
  for (const o of outcomes) {
    const fired = [...o.fired].sort((x, y) => y[1].count - x[1].count).map(([c, f]) => `${c} (${f.count})`).join(", ") || "none";
    const verdict = o.control ? (o.anomalies === 0 ? "clean (control)" : "ANOMALIES (control)") : o.anomalies > 0 ? "yes" : "**no**";
    out(`| ${o.control ? "control " : ""}${o.b.id}: ${o.b.name} | ${o.seed} | \`${o.b.profile.join(" ")}\` | ${verdict} | ${fired} | ${o.seconds} s |`);
  }
  const good = outcomes.every((o) => (o.control ? o.anomalies === 0 && o.exitCode === 0 : o.anomalies > 0));
  return good ? 0 : 1;
}

const stop = () => {
  const { child, scratch, root } = current;
  if (child?.pid !== undefined) {
    try {
      process.kill(-child.pid, "SIGINT");
    } catch {
      // gone
    }
  }
  setTimeout(() => {
    if (child?.pid !== undefined) {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    if (scratch !== null) removeScratch(scratch);
    if (root !== null) removeRun(root);
    process.exit(130);
  }, 5000).unref();
};
process.once("SIGINT", stop);
process.once("SIGTERM", stop);

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`chaos:breaks: ${(err as Error)?.message ?? String(err)}\n`);
    process.exit(1);
  },
);
