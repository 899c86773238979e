/**
 * Small helpers every benchmark shares: percentiles, a latency summary and an aligned text table.
 * Benchmarks print numbers; they never assert on them.
 */
import { readdirSync, readFileSync } from "node:fs";

/** A latency summary in milliseconds. */
export interface Summary {
  readonly n: number;
  readonly min: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly max: number;
  readonly mean: number;
}

/**
 * The `p`-th percentile (0..100) of ascending `sorted` samples, nearest-rank method. NaN for no
 * samples. Throws RangeError for p outside 0..100.
 */
export function percentile(sorted: readonly number[], p: number): number {
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile: p must be within 0..100, got ${p}`);
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1]!;
}

/** Summarizes samples (any order; the input is not mutated). */
export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].sort((a, b) => a - b);
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    n: sorted.length,
    min: sorted[0] ?? Number.NaN,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: sorted.at(-1) ?? Number.NaN,
    mean: sorted.length === 0 ? Number.NaN : sum / sorted.length,
  };
}

/** Milliseconds with a precision that suits their size. */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return "n/a";
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(3);
}

/** Renders rows as an aligned plain-text table (columns from the first row's keys). */
export function table(rows: readonly Record<string, string | number>[]): string {
  if (rows.length === 0) return "";
  const columns = Object.keys(rows[0]!);
  const cells = [columns, ...rows.map((r) => columns.map((c) => String(r[c] ?? "")))];
  const widths = columns.map((_, i) => Math.max(...cells.map((row) => row[i]!.length)));
  return cells.map((row) => row.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join("  ")).join("\n");
}

/** The fields of /proc/PID/stat the benchmarks read (times in clock ticks). */
export interface ProcStat {
  readonly name: string;
  readonly ppid: number;
  /** utime + stime: the process's own CPU. */
  readonly own: number;
  /** cutime + cstime: the CPU of the children it reaped. */
  readonly reaped: number;
}

/**
 * Parses a /proc/PID/stat line. The name (field 2) is in parentheses and may hold spaces or ")":
 * the fields are split after the last ")". Throws when the line cannot be parsed.
 */
export function parseProcStat(stat: string): ProcStat {
  const close = stat.lastIndexOf(")");
  // rest[0] is field 3 (state); ppid is field 4, utime..cstime are fields 14 to 17.
  const rest = stat.slice(close + 2).split(" ");
  const [ppid, utime, stime, cutime, cstime] = [rest[1], rest[11], rest[12], rest[13], rest[14]].map(Number) as [number, number, number, number, number];
  if (close < 0 || ![ppid, utime, stime, cutime, cstime].every(Number.isFinite)) throw new Error(`cannot parse /proc stat line: ${stat}`);
  return { name: stat.slice(stat.indexOf("(") + 1, close), ppid, own: utime + stime, reaped: cutime + cstime };
}

/**
 * CPU time by process group on the whole machine, from /proc (Linux only), for one measured window:
 * this process itself (as `process.cpuUsage()` sees it), the children it reaped (a plain spawn's
 * `true`), its direct children still alive by name (each with the children they reaped: the cell
 * launcher's reaped gates are its cells), and the machine as a whole (every CPU's non-idle time).
 */
export interface CpuBreakdown {
  /** Milliseconds of CPU per group: "self", "reaped", one key per live child's name, "machine". */
  readonly ms: Readonly<Record<string, number>>;
  /** Online CPUs. */
  readonly cores: number;
}

function procStat(pid: string): ProcStat | null {
  try {
    return parseProcStat(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return null; // gone meanwhile
  }
}

interface CpuSample {
  readonly ticks: Map<string, number>;
  readonly machine: number;
  readonly cores: number;
}

function cpuSample(): CpuSample | null {
  let stat: string;
  try {
    stat = readFileSync("/proc/stat", "utf8");
  } catch {
    return null;
  }
  const lines = stat.split("\n");
  // cpu user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait.
  const f = lines[0]!.trim().split(/\s+/).slice(1).map(Number);
  const machine = f.reduce((a, b) => a + b, 0) - (f[3] ?? 0) - (f[4] ?? 0);
  const cores = lines.filter((l) => /^cpu\d/.test(l)).length;
  const ticks = new Map<string, number>();
  const me = procStat(String(process.pid));
  if (me !== null) ticks.set("reaped", me.reaped);
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const p = procStat(pid);
    if (p === null || p.ppid !== process.pid) continue;
    ticks.set(p.name, (ticks.get(p.name) ?? 0) + p.own + p.reaped);
  }
  return { ticks, machine, cores };
}

/**
 * Starts a measured window; the function it returns ends it and returns the CPU spent in it, or null
 * where /proc is not readable. `hz`: clock ticks per second (`clockTicksPerSecond()` in idle.ts). A
 * child that exits inside the window is missed (its time goes to the machine total only); the
 * benchmarks' children (etcd members, the cell launcher) live through it.
 */
export function startCpuWindow(hz: number): () => CpuBreakdown | null {
  const before = cpuSample();
  const self0 = process.cpuUsage();
  return () => {
    const after = cpuSample();
    const self = process.cpuUsage(self0);
    if (before === null || after === null) return null;
    const ms: Record<string, number> = { self: (self.user + self.system) / 1000 };
    for (const [k, v] of after.ticks) {
      const d = ((v - (before.ticks.get(k) ?? 0)) * 1000) / hz;
      if (d > 0) ms[k] = d;
    }
    ms["machine"] = ((after.machine - before.machine) * 1000) / hz;
    return { ms, cores: after.cores };
  };
}
