/**
 * Small helpers every benchmark shares: percentiles, a latency summary and an aligned text table.
 * Benchmarks print numbers; they never assert on them.
 */

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
