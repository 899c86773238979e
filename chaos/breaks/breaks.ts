/**
 * The deliberate breaks of the harness: each is a small patch (`git diff` format, against
 * the current tree) that puts one named bug back, with the nemesis profile that shows it. run.ts
 * applies one to a scratch copy of the repository and runs the nemesis there; patches.test.ts checks
 * that every patch still applies to the tree, so that they cannot rot silently.
 */
import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, copyFileSync, realpathSync, rmSync, symlinkSync, lstatSync, readlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = fileURLToPath(new URL("../../", import.meta.url));
export const BREAKS_DIR = fileURLToPath(new URL("./", import.meta.url));

export interface Break {
  /** a, b, c or d (the order of the list). */
  readonly id: string;
  readonly name: string;
  /** File name under chaos/breaks/. */
  readonly patch: string;
  /** Which code it changes, in one line. */
  readonly where: string;
  /** Arguments of chaos/nemesis/main.ts (the seed and --keep are added by the runner). */
  readonly profile: readonly string[];
  /** The checks expected to fire. */
  readonly expect: readonly string[];
}

export const BREAKS: readonly Break[] = [
  {
    id: "a",
    name: "epoch guard removed",
    patch: "a-epoch-guard.patch",
    where: "sqlite: the commit transaction skips the owner-epoch compare; replicated: the commit txn no longer compares the epoch key",
    profile: ["--minutes", "2", "--runs", "40", "--only", "race-opener,pause-worker"],
    expect: ["stale-epoch-commit"],
  },
  {
    id: "b",
    name: "re-running an UnknownExecution",
    patch: "b-rerun-unknown.patch",
    where: "recovery launches a `started` execution without a result again (with a fresh identity) instead of recording UnknownExecution",
    profile: ["--minutes", "2", "--faults", "120", "--runs", "40", "--only", "kill-worker", "--sqlite-only"],
    expect: ["double-start"],
  },
  {
    id: "c",
    name: "skipping the wait for the old lease",
    patch: "c-skip-lease-wait.patch",
    where: "openAfterPrevious (lease.ts, called by Harness.open) no longer awaits the earlier owners' liveness leases",
    profile: ["--minutes", "2", "--faults", "60", "--runs", "40", "--only", "stall-takeover", "--sqlite-only", "--host-per-worker", "--long-ms", "6000"],
    expect: ["effect-after-newer-owner"],
  },
  {
    id: "d",
    name: "acknowledging before the commit resolves",
    patch: "d-ack-before-commit.patch",
    where: "replicated: the commit pipeline resolves before the etcd txn answers; sqlite: commit resolves with predicted seqs and runs the transaction later",
    profile: ["--minutes", "2", "--runs", "40", "--only", "race-opener,kill-worker,pause-leader,disk-full"],
    expect: ["acked-missing"],
  },
];

/** The break named `id`, or a one-sentence error listing the names. */
export function breakNamed(id: string): Break {
  const b = BREAKS.find((x) => x.id === id);
  if (b === undefined) throw new Error(`no break named "${id}"; the breaks are ${BREAKS.map((x) => x.id).join(", ")}`);
  return b;
}

export function patchPath(b: Break): string {
  return join(BREAKS_DIR, b.patch);
}

/**
 * A scratch copy of the repository's tracked files as they are in the working tree (uncommitted
 * edits included), with node_modules a symlink to the repository's. Returns its directory.
 */
export function scratchCopy(repo = REPO): string {
  const dir = mkdtempSync(join(tmpdir(), "cairn-break-"));
  // The replicated workers run as `nobody` from files under it (the bundles under node_modules/.cache).
  chmodSync(dir, 0o755);
  const files = execFileSync("git", ["ls-files", "-z"], { cwd: repo, encoding: "utf8", maxBuffer: 64 << 20 }).split("\0").filter((f) => f !== "");
  for (const f of files) {
    const from = join(repo, f);
    if (!existsSync(from)) continue; // deleted in the working tree
    const to = join(dir, f);
    mkdirSync(dirname(to), { recursive: true });
    const st = lstatSync(from);
    if (st.isSymbolicLink()) symlinkSync(readlinkSync(from), to);
    else copyFileSync(from, to);
  }
  symlinkSync(realpathSync(join(repo, "node_modules")), join(dir, "node_modules"));
  // Its own (empty) repository, so that `git apply` takes the patch's paths from this directory even
  // when the temporary directory lies inside some other repository.
  execFileSync("git", ["init", "-q"], { cwd: dir, stdio: "ignore" });
  return dir;
}

/**
 * `git apply` of `patch` in `dir` (which need not be a git repository); with `check`, only whether it
 * applies cleanly. Throws with git's own message when it does not.
 */
export function applyPatch(dir: string, patch: string, check = false): void {
  try {
    execFileSync("git", ["apply", ...(check ? ["--check"] : []), "--whitespace=nowarn", patch], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], encoding: "utf8" });
  } catch (err) {
    const stderr = String((err as { stderr?: unknown }).stderr ?? "").trim();
    throw new Error(`the patch ${patch} does not apply to ${dir}: ${stderr || (err as Error).message}`);
  }
}

export function removeScratch(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
