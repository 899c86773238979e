/**
 * Shared helpers for the executor tests: a temp dir, an output collector and a liveness check.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LaunchSpec } from "../../src/exec/executor.js";
import { isDead, readProcStat } from "../../src/exec/procfs.js";

/** A fresh temporary directory and a function that removes it. */
export function tempDir(prefix = "cairn-exec-"): { dir: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Collects every onOutput call. */
export function collector(delayMs = 0): {
  onOutput: LaunchSpec["onOutput"];
  calls: { stream: "stdout" | "stderr"; data: string }[][];
  text: (stream: "stdout" | "stderr") => string;
  maxConcurrent: () => number;
} {
  const calls: { stream: "stdout" | "stderr"; data: string }[][] = [];
  let inFlight = 0;
  let max = 0;
  return {
    calls,
    async onOutput(chunks) {
      inFlight++;
      max = Math.max(max, inFlight);
      calls.push(chunks.map((c) => ({ ...c })));
      if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
      inFlight--;
    },
    text: (stream) =>
      calls
        .flat()
        .filter((c) => c.stream === stream)
        .map((c) => c.data)
        .join(""),
    maxConcurrent: () => max,
  };
}

/** True when `pid` is a live (non-zombie) process. */
export function isAlive(pid: number): boolean {
  const stat = readProcStat(pid);
  return stat !== null && !isDead(stat);
}

/** Kills a process group, ignoring "no such process". For `finally` cleanup. */
export function killGroupQuietly(pgid: number): void {
  try {
    process.kill(-pgid, "SIGKILL");
  } catch (_err) {
    /* already gone */
  }
}

/** Waits until `predicate` holds, polling; throws after `ms` (a safety net, not a timing assertion). */
export async function waitFor(predicate: () => boolean, ms = 10_000, what = "condition"): Promise<void> {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A process's command name (/proc/PID/comm), or null when it is gone. */
export function comm(pid: number): string | null {
  try {
    return readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch (_err) {
    return null;
  }
}

/**
 * Connects to the abstract socket `name` (a launcher's harness end), writes `payload`, and resolves
 * true once the other end closes the connection, false when it is still open after 60 s.
 */
export function closedAfterWriting(path: string, payload: string): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = connect(path, () => s.write(payload));
    s.on("error", () => resolve(true));
    s.on("close", () => resolve(true));
    setTimeout(() => {
      s.destroy();
      resolve(false);
    }, 60_000);
  });
}
