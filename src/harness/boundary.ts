/**
 * Where a harness's cells run: the sandbox chosen at open, the harness's private runtime directory
 * (scripts, the cell API socket, the `cairn` command and the `cairn_effects` Python module for
 * cells), and the boundary of each launch.
 *
 * The runtime directory is made with mkdtemp (0700, this user's, a name nobody could have made
 * first) and removed at close. Scripts live in a directory of their run's inside it, one file per
 * launch (src/exec/launch.ts), so no two runs and no two launches share a path.
 */
import { createHash } from "node:crypto";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { type CellLimits, DEFAULT_CELL_LIMITS } from "../exec/cgroup.js";
import type { CellBoundary } from "../exec/executor.js";
import { ensurePrivateDir, makePrivateTempDir } from "../exec/private.js";
import { type CellNetwork, type SandboxMode, chooseSandbox, defaultHiddenPaths } from "../exec/sandbox.js";
import type { SessionProjection } from "../state/projection.js";
import { PYTHON_EFFECTS_FILE, PYTHON_EFFECTS_SOURCE } from "./python-effects.js";

/** How a harness contains its cells (every field optional). */
export interface SandboxOptions {
  /** `auto` (default): sandbox when one can be built, else run without and report it; `required`; `none`. */
  readonly mode?: SandboxMode;
  /** The network of every run's cells unless the run asked for the host's: `off` (default) or `host`. */
  readonly network?: CellNetwork;
  /** Names of this process's environment variables passed on to cells (e.g. GIT_AUTHOR_NAME). */
  readonly passEnv?: readonly string[];
  /** More paths cells must not see (the data dir, key files). Credentials in the home dir are hidden always. */
  readonly hide?: readonly string[];
  readonly limits?: Partial<CellLimits>;
}

/** What the harness reports about its cells' boundary (status, metrics, the log). */
export interface SandboxState {
  readonly kind: "bwrap" | "none";
  /** Why there is no sandbox (`--sandbox none`, or what the probe found), null with one. */
  readonly reason: string | null;
}

/** A Unix socket path must fit sun_path (108 bytes); keep a margin. */
const MAX_SOCKET_PATH = 100;

/**
 * The `cairn` command cells call (`cairn timer`): this same installation. When this process is the
 * CLI (bin/cairn.js, a bundle such as the image's /app/cairn.mjs, or src/cli/entry.ts under tsx), the
 * same entry with the same loader; otherwise (the Harness API in a program of its own) the CLI of the
 * checkout this module belongs to.
 */
function cairnShim(): string {
  const quote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;
  const node = quote(process.execPath);
  const entry = process.argv[1];
  if (entry !== undefined && /^(cairn(\.m?js)?|entry\.[jt]s)$/.test(basename(entry))) {
    const loader = process.execArgv.flatMap((a, i, all) => (a === "--import" && all[i + 1] !== undefined ? ["--import", import.meta.resolve(all[i + 1]!)] : []));
    return `#!/bin/sh\nexec ${node} ${loader.map(quote).join(" ")} ${quote(resolve(entry))} "$@"\n`;
  }
  const here = fileURLToPath(import.meta.url);
  const fromSource = here.endsWith(".ts");
  const root = resolve(dirname(here), fromSource ? "../.." : "../../..");
  if (fromSource) {
    const tsx = import.meta.resolve("tsx");
    return `#!/bin/sh\nexec ${node} --import ${quote(tsx)} ${quote(join(root, "src", "cli", "entry.ts"))} "$@"\n`;
  }
  return `#!/bin/sh\nexec ${node} ${quote(join(root, "bin", "cairn.js"))} "$@"\n`;
}

/** One harness's cell boundary: decided at open, asked at every launch. */
export class Boundaries {
  readonly state: SandboxState;
  readonly runtimeDir: string;
  readonly socketPath: string;
  private readonly sandbox: CellBoundary["sandbox"];
  private readonly binDir: string;
  /** Cairn's Python modules for cells (cairn_effects): on every cell's PYTHONPATH. */
  private readonly pythonDir: string;
  private readonly limits: CellLimits;

  /** Chooses the sandbox (throws ConfigError when `required` and none can be built) and makes the runtime dir under `workDir`. */
  constructor(
    private readonly options: SandboxOptions,
    workDir: string | undefined,
  ) {
    const chosen = chooseSandbox(options.mode ?? "auto");
    this.sandbox = chosen.kind === "bwrap" ? chosen : { kind: "none" };
    this.state = { kind: chosen.kind, reason: chosen.kind === "none" ? chosen.reason : null };
    this.limits = { ...DEFAULT_CELL_LIMITS, ...options.limits };
    let parent = workDir ?? tmpdir();
    // The socket's path must stay short: a deep workDir gives way to the OS temp dir (mkdtemp is
    // safe there too).
    if (join(parent, "cairn-XXXXXX", "cell.sock").length > MAX_SOCKET_PATH) parent = tmpdir();
    if (workDir !== undefined && parent === workDir) ensurePrivateDir(workDir);
    this.runtimeDir = makePrivateTempDir("cairn-", parent);
    this.socketPath = join(this.runtimeDir, "cell.sock");
    this.binDir = join(this.runtimeDir, "bin");
    ensurePrivateDir(this.binDir);
    writeFileSync(join(this.binDir, "cairn"), cairnShim(), { mode: 0o700 });
    this.pythonDir = join(this.runtimeDir, "python");
    ensurePrivateDir(this.pythonDir);
    writeFileSync(join(this.pythonDir, PYTHON_EFFECTS_FILE), PYTHON_EFFECTS_SOURCE, { mode: 0o600 });
  }

  /** The private directory of `session`'s scripts. */
  scriptDir(session: string): string {
    const dir = join(this.runtimeDir, "scripts", createHash("sha256").update(session).digest("hex").slice(0, 16));
    ensurePrivateDir(dir);
    return dir;
  }

  /** The boundary of a launch in `session`, hiding the workspaces of `others` (the other unfinished runs). */
  forSession(session: SessionProjection | undefined, others: readonly string[]): CellBoundary {
    const network: CellNetwork = session?.cell_network === "host" || this.options.network === "host" ? "host" : "off";
    const own = session?.cwd;
    return {
      sandbox: this.sandbox,
      network: this.sandbox.kind === "none" ? "host" : network,
      hide: [...defaultHiddenPaths(), ...(this.options.hide ?? []), this.runtimeDir, ...others.filter((cwd) => cwd !== own)],
      socket: this.socketPath,
      binDir: this.binDir,
      pythonDir: this.pythonDir,
      passEnv: this.options.passEnv ?? [],
      limits: this.limits,
    };
  }

  /** Removes the runtime dir (scripts, the shim). */
  close(): void {
    rmSync(this.runtimeDir, { recursive: true, force: true });
  }
}
