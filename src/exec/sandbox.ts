/**
 * The cell boundary: every cell and every validator runs inside a bubblewrap sandbox (Linux).
 *
 * What a sandboxed cell gets: its own PID, IPC, UTS and network namespaces (no route anywhere, not
 * even the host's loopback, unless its run or worker opted in with network "host"); the root file
 * system read-only; writable: its workspace (the run's cwd) and a private /tmp; a fresh /proc that
 * shows only its own processes; no capabilities, and no way to gain any (bubblewrap sets
 * no_new_privs). Not visible at all: /run (the host's sockets and mounted secrets), the paths the
 * harness names (its data dir, its private runtime dir, other runs' workspaces, credential files),
 * even when they lie inside the workspace. Cairn's own init (native/launcher.c, `init --pid1`) is the
 * namespace's first process: when the cell's main process ends, the kernel ends every process left
 * in the namespace, `setsid` and double-forked ones included.
 *
 * This module decides and describes; it starts nothing. `bwrapArgv` is a pure function of the
 * launch, so what a cell can see is testable without running it.
 */
import { spawnSync } from "node:child_process";
import { statSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, join, relative, resolve, sep } from "node:path";
import { ConfigError } from "../errors.js";
import { which } from "./which.js";

/** How cells are contained: `required` (refuse to run cells without a sandbox), `auto` (sandbox when one can be built, else warn once and run without), `none` (no sandbox: the operator accepts the risk). */
export type SandboxMode = "auto" | "required" | "none";
/** A cell's network: `off` (its own empty network namespace) or `host` (the host's network). */
export type CellNetwork = "off" | "host";

/** Where the cell sees what Cairn binds into its sandbox. */
export const SANDBOX_RUN_DIR = "/run/cairn";
/** The cell's init inside the sandbox. */
export const SANDBOX_INIT = `${SANDBOX_RUN_DIR}/init`;

/** A file or directory bound into the sandbox at `dest`. */
export interface SandboxBind {
  readonly src: string;
  readonly dest: string;
  /** Writable inside (default: read-only). */
  readonly writable?: boolean;
}

/** One sandboxed launch, as `bwrapArgv` needs it. */
export interface SandboxLaunch {
  /** Absolute path of bwrap on the host. */
  readonly bwrap: string;
  /** Absolute path of the launcher binary on the host (bound in as the cell's init). */
  readonly init: string;
  /** The cell's workspace: its cwd, the one writable host directory. Absolute. */
  readonly cwd: string;
  readonly network: CellNetwork;
  /** Absolute host paths the cell must not see (files or directories; those that do not exist are skipped by the caller). */
  readonly hide: readonly { readonly path: string; readonly dir: boolean }[];
  /** Files bound in read-only (a script, a shim) or read-write (the cell's socket). */
  readonly binds: readonly SandboxBind[];
  /** Size of the private /tmp in bytes (it counts against the cell's memory), or undefined for the default. */
  readonly tmpBytes?: number;
  /** Arguments of the init before `--` (limits), after `init --pid1`. */
  readonly initArgs: readonly string[];
  /** The cell's argv (program first). */
  readonly argv: readonly string[];
}

/** True when `child` is `parent` or lies inside it (both absolute, normalized). */
export function isWithin(child: string, parent: string): boolean {
  const rel = relative(parent, child);
  return rel === "" || (!rel.startsWith("..") && !isAbsolute(rel) && rel.split(sep)[0] !== "..");
}

/**
 * The bwrap command line of a launch (program first). Mount order matters: a later mount covers an
 * earlier one, so paths to hide that lie outside the workspace are covered before the workspace is
 * bound, and those inside it (a data dir inside the cwd) after.
 */
export function bwrapArgv(l: SandboxLaunch): string[] {
  const a: string[] = [l.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--as-pid-1", "--cap-drop", "ALL", "--hostname", "cairn-cell"];
  if (l.network === "off") a.push("--unshare-net");
  a.push("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc");
  if (l.tmpBytes !== undefined) a.push("--size", String(l.tmpBytes));
  a.push("--tmpfs", "/tmp", "--tmpfs", "/run");
  // A hidden directory becomes an empty read-only one; a hidden file, an empty read-only one.
  const cover = (h: { path: string; dir: boolean }): void => {
    if (h.dir) a.push("--tmpfs", h.path, "--remount-ro", h.path);
    else a.push("--ro-bind", "/dev/null", h.path);
  };
  // The workspace and its ancestors stay visible (hiding one would hide the workspace). A path inside
  // another hidden one is hidden with it (and could not be mounted on: that one is read-only). /tmp and
  // /run are fresh and empty: what lay there is gone already, unless the workspace is there.
  const fresh = (p: string): boolean => isWithin(p, "/tmp") || isWithin(p, "/run");
  const candidates = l.hide.filter((h) => !isWithin(l.cwd, h.path) && !(fresh(h.path) && !isWithin(h.path, l.cwd)));
  const hide = candidates.filter((h) => !candidates.some((o) => o.path !== h.path && isWithin(h.path, o.path)));
  const inside = hide.filter((h) => isWithin(h.path, l.cwd));
  for (const h of hide) if (!isWithin(h.path, l.cwd)) cover(h);
  a.push("--bind", l.cwd, l.cwd);
  for (const h of inside) cover(h);
  a.push("--ro-bind", l.init, SANDBOX_INIT);
  for (const b of l.binds) a.push(b.writable === true ? "--bind" : "--ro-bind", b.src, b.dest);
  a.push("--chdir", l.cwd, "--", SANDBOX_INIT, "init", "--pid1", ...l.initArgs, "--", ...l.argv);
  return a;
}

/**
 * Credential files and directories of the harness's user that a cell never needs (keys, tokens,
 * cloud and cluster credentials), hidden whenever they exist; `/run` (where Kubernetes and systemd
 * mount secrets, and the host's sockets live) is replaced by an empty one in every sandbox.
 */
export function defaultHiddenPaths(home: string = homedir()): string[] {
  const inHome = [
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/cairn",
    ".kube",
    ".docker",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".anthropic",
    ".openai",
  ];
  return [...inHome.map((p) => join(home, p)), "/etc/cairn", "/var/run/secrets", "/var/lib/cairn"];
}

/**
 * Of `paths`, those that exist, as absolute paths with whether each is a directory. Symbolic links
 * are kept as given (bwrap covers the path the cell would open).
 */
export function existingPaths(paths: readonly string[]): { path: string; dir: boolean }[] {
  const out: { path: string; dir: boolean }[] = [];
  const seen = new Set<string>();
  for (const p of paths) {
    const abs = resolve(p);
    if (seen.has(abs) || abs === "/") continue;
    seen.add(abs);
    const st = statSync(abs, { throwIfNoEntry: false });
    if (st === undefined) continue;
    out.push({ path: abs, dir: st.isDirectory() });
  }
  return out;
}

/** What `probeSandbox` found: bwrap, and whether it can build a sandbox here; or why not. */
export type SandboxProbe = { readonly ok: true; readonly bwrap: string } | { readonly ok: false; readonly reason: string };

let probed: SandboxProbe | null = null;

/**
 * Whether a bubblewrap sandbox can be built on this machine: bwrap on PATH, and a trial sandbox with
 * the namespaces cells get, running bwrap itself (`--version`: present wherever bwrap is, unlike `true`
 * in a minimal image). Asked once per process (about 10 ms); `refresh` asks again.
 */
export function probeSandbox(options: { refresh?: boolean; pathEnv?: string } = {}): SandboxProbe {
  if (probed !== null && options.refresh !== true && options.pathEnv === undefined) return probed;
  const result = probeOnce(options.pathEnv);
  if (options.pathEnv === undefined) probed = result;
  return result;
}

function probeOnce(pathEnv: string | undefined): SandboxProbe {
  if (process.platform !== "linux") return { ok: false, reason: `cells can be sandboxed on Linux only (this is ${process.platform})` };
  const bwrap = which("bwrap", pathEnv === undefined ? {} : { pathEnv });
  if (bwrap === null) return { ok: false, reason: "bubblewrap (bwrap) is not installed" };
  const trial = spawnSync(
    bwrap,
    ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--as-pid-1", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", bwrap, "--version"],
    { encoding: "utf8", timeout: 10_000, env: { PATH: process.env.PATH ?? "/usr/bin:/bin" } },
  );
  if (trial.status === 0) return { ok: true, bwrap };
  const why = (trial.error?.message ?? trial.stderr ?? "").trim().split("\n")[0]?.slice(0, 300) ?? "";
  return { ok: false, reason: `bubblewrap cannot build a sandbox here (${why || `exit ${trial.status}`}); user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone, or a container without them)` };
}

/** The package and flags a refusal names. */
export const SANDBOX_HELP =
  "install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) on a kernel with user namespaces, or pass --sandbox none (CAIRN_SANDBOX=none) to run cells without a sandbox, with the harness's user's reach: its files, its network, its other processes";

/**
 * What a launch uses: bubblewrap at a path, or none. `required` throws a ConfigError that names the
 * package to install and the flag that accepts the risk; `auto` falls back to none with the reason.
 */
export function chooseSandbox(mode: SandboxMode, probe: () => SandboxProbe = probeSandbox): { kind: "bwrap"; bwrap: string } | { kind: "none"; reason: string } {
  if (mode === "none") return { kind: "none", reason: "--sandbox none" };
  const p = probe();
  if (p.ok) return { kind: "bwrap", bwrap: p.bwrap };
  if (mode === "required") throw new ConfigError(`cells must run in a sandbox, and none can be built here: ${p.reason}. To fix it, ${SANDBOX_HELP}`);
  return { kind: "none", reason: p.reason };
}
