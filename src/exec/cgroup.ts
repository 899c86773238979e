/**
 * Per-cell limits through cgroups, where the machine lets this process create them (root, or a
 * delegated cgroup v2 subtree): a memory limit (the kernel's OOM killer acts inside the cell's group
 * only) and a process limit (a fork bomb gets EAGAIN, the worker keeps its processes). Each cell gets
 * a group of its own, created before its gate is released, so every process it starts is counted;
 * when the cell ends, whatever is left in the group is killed and the group removed.
 *
 * Both hierarchies are supported: cgroup v2 (one tree, `memory.max`, `pids.max`, `memory.events`,
 * `cgroup.kill`) and v1 (separate `memory` and `pids` trees, `memory.limit_in_bytes`,
 * `memory.oom_control`'s `oom_kill`, `pids.events`). Where neither can be written, `detectCgroups`
 * returns null and the cell's init applies rlimits instead (RLIMIT_NPROC, RLIMIT_DATA): weaker (per
 * user and per process), and said so in the README.
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, rmdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** The limits of one cell. */
export interface CellLimits {
  /** Memory of all the cell's processes together (and its /tmp), in bytes. */
  readonly memoryBytes: number;
  /** Processes (and threads) the cell may have at once. */
  readonly processes: number;
}

/** Default limits: enough for a build or a test suite, not enough to take a worker down. */
export const DEFAULT_CELL_LIMITS: CellLimits = { memoryBytes: 2 * 1024 ** 3, processes: 512 };

/** What happened in a cell's group, read when it ended. */
export interface CgroupReport {
  /** Processes the kernel killed for the memory limit. */
  readonly oomKills: number;
  /** Forks refused for the process limit. */
  readonly pidsRefused: number;
}

/** One cell's group. */
export interface CellCgroup {
  /** Moves `pid` (the gate, before release) into the group; its children follow. */
  add(pid: number): void;
  /** Counters that say whether a limit was hit. */
  report(): CgroupReport;
  /** Kills every process left in the group, then removes it. Never throws. */
  close(): Promise<void>;
}

/** Creates cell groups under one parent per process. */
export interface CellCgroups {
  readonly version: 1 | 2;
  create(limits: CellLimits): CellCgroup;
}

const read = (path: string): string => {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
};

/** The value of `key N` in a flat-keyed cgroup file, 0 when absent. */
function counter(text: string, key: string): number {
  const m = new RegExp(`^${key} (\\d+)$`, "m").exec(text);
  return m === null ? 0 : Number(m[1]);
}

function pidsIn(dir: string): number[] {
  return read(join(dir, "cgroup.procs"))
    .split("\n")
    .filter((l) => l !== "")
    .map(Number)
    .filter((n) => Number.isInteger(n) && n > 0);
}

async function killAll(dirs: readonly string[]): Promise<void> {
  for (let round = 0; round < 50; round++) {
    const pids = new Set(dirs.flatMap(pidsIn));
    if (pids.size === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone meanwhile
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

function removeDir(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // still busy (a zombie not reaped yet) or gone: a later sweep of the parent removes it
  }
}

/** This process's own cgroup v2 path, or null. */
function ownV2Path(): string | null {
  const line = read("/proc/self/cgroup")
    .split("\n")
    .find((l) => l.startsWith("0::"));
  return line === undefined ? null : line.slice(3);
}

function writable(dir: string): boolean {
  try {
    const probe = join(dir, `cairn-probe-${process.pid}-${randomBytes(4).toString("hex")}`);
    mkdirSync(probe);
    rmdirSync(probe);
    return true;
  } catch {
    return false;
  }
}

function v2(root: string): CellCgroups | null {
  const own = ownV2Path();
  if (own === null) return null;
  // A process in a leaf cannot have children groups with controllers ("no internal processes"):
  // cells go into a sibling group of this process's, which must be writable and have both controllers.
  const parent = join(root, own, "..");
  if (!read(join(parent, "cgroup.subtree_control")).split(/\s+/).includes("memory")) return null;
  if (!read(join(parent, "cgroup.subtree_control")).split(/\s+/).includes("pids")) return null;
  if (!writable(parent)) return null;
  const base = join(parent, `cairn-${process.pid}`);
  return {
    version: 2,
    create(limits) {
      mkdirSync(base, { recursive: true });
      writeFileSync(join(base, "cgroup.subtree_control"), "+memory +pids");
      const dir = join(base, `cell-${randomBytes(6).toString("hex")}`);
      mkdirSync(dir);
      writeFileSync(join(dir, "memory.max"), String(limits.memoryBytes));
      writeFileSync(join(dir, "memory.swap.max"), "0", { flag: "w" });
      writeFileSync(join(dir, "pids.max"), String(limits.processes));
      return {
        add: (pid) => writeFileSync(join(dir, "cgroup.procs"), String(pid)),
        report: () => ({ oomKills: counter(read(join(dir, "memory.events")), "oom_kill"), pidsRefused: counter(read(join(dir, "pids.events")), "max") }),
        async close() {
          try {
            writeFileSync(join(dir, "cgroup.kill"), "1");
          } catch {
            // kernels before 5.14: killed one by one below
          }
          await killAll([dir]);
          removeDir(dir);
        },
      };
    },
  };
}

function v1(root: string): CellCgroups | null {
  const memory = join(root, "memory");
  const pids = join(root, "pids");
  if (statSync(join(memory, "memory.limit_in_bytes"), { throwIfNoEntry: false }) === undefined) return null;
  if (statSync(join(pids, "pids.max"), { throwIfNoEntry: false }) === undefined && statSync(join(pids, "cgroup.procs"), { throwIfNoEntry: false }) === undefined) return null;
  // This process's own place in each hierarchy: cells go below it.
  const own = (controller: string): string => {
    const line = read("/proc/self/cgroup")
      .split("\n")
      .find((l) => l.split(":")[1]?.split(",").includes(controller));
    return line === undefined ? "/" : (line.split(":")[2] ?? "/");
  };
  const memBase = join(memory, own("memory"), `cairn-${process.pid}`);
  const pidsBase = join(pids, own("pids"), `cairn-${process.pid}`);
  if (!writable(join(memory, own("memory"))) || !writable(join(pids, own("pids")))) return null;
  return {
    version: 1,
    create(limits) {
      const name = `cell-${randomBytes(6).toString("hex")}`;
      const mem = join(memBase, name);
      const pid = join(pidsBase, name);
      mkdirSync(mem, { recursive: true });
      mkdirSync(pid, { recursive: true });
      writeFileSync(join(mem, "memory.limit_in_bytes"), String(limits.memoryBytes));
      // Without swap accounting this file is absent: memory is then bounded without swap counted.
      try {
        writeFileSync(join(mem, "memory.memsw.limit_in_bytes"), String(limits.memoryBytes));
      } catch {
        // no swap accounting
      }
      writeFileSync(join(pid, "pids.max"), String(limits.processes));
      return {
        add(p) {
          writeFileSync(join(mem, "cgroup.procs"), String(p));
          writeFileSync(join(pid, "cgroup.procs"), String(p));
        },
        report: () => ({ oomKills: counter(read(join(mem, "memory.oom_control")), "oom_kill"), pidsRefused: counter(read(join(pid, "pids.events")), "max") }),
        async close() {
          await killAll([mem, pid]);
          removeDir(mem);
          removeDir(pid);
        },
      };
    },
  };
}

let detected: CellCgroups | null | undefined;

/**
 * The cgroups this process can create cell groups in, or null (no cgroup file system, or not
 * writable by this user). Decided once per process.
 */
export function detectCgroups(root = "/sys/fs/cgroup"): CellCgroups | null {
  if (root !== "/sys/fs/cgroup") return detect(root);
  if (detected === undefined) detected = detect(root);
  return detected;
}

function detect(root: string): CellCgroups | null {
  if (process.platform !== "linux") return null;
  try {
    if (statSync(join(root, "cgroup.controllers"), { throwIfNoEntry: false }) !== undefined) return v2(root);
    return v1(root);
  } catch {
    return null;
  }
}

/** A byte count in words: "2 GiB", "512 MiB", "1.5 GiB". */
export function formatBytes(n: number): string {
  const units = [
    ["GiB", 1024 ** 3],
    ["MiB", 1024 ** 2],
    ["KiB", 1024],
  ] as const;
  for (const [unit, size] of units) {
    if (n >= size) return `${Number((n / size).toFixed(1))} ${unit}`;
  }
  return `${n} bytes`;
}
