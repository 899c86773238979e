/**
 * The flags that say how cells are contained: the sandbox, their network, what of this process's
 * environment they get, what they must not see, and their limits.
 */
import type { SandboxOptions } from "../harness/boundary.js";
import { ENV_NAME } from "../exec/environment.js";
import type { CellNetwork, SandboxMode } from "../exec/sandbox.js";
import { type Parsed, list, str, UsageError } from "./args.js";

export const CELL_FLAGS = {
  sandbox: { type: "string" },
  "cell-network": { type: "string" },
  "cell-env": { type: "string", multiple: true },
  "cell-hide": { type: "string", multiple: true },
  "cell-memory": { type: "string" },
  "cell-processes": { type: "string" },
} as const;

export const CELL_HELP = `  --sandbox MODE          required | auto | none: cells and validators run in a bubblewrap sandbox
                          (own PID and network namespaces, the root read-only, only the workspace
                          and a private /tmp writable, the data dir and secrets out of sight).
                          auto (default for run and resume) runs without one, with a warning, where
                          none can be built; required (default for serve) refuses to start then;
                          none runs cells with this user's full reach (CAIRN_SANDBOX)
  --cell-network MODE     off (default): no network at all in cells, not even this host's loopback;
                          host: the host's network (recorded in the run's log) (CAIRN_CELL_NETWORK)
  --cell-env NAME         pass this environment variable on to cells (repeatable; CAIRN_CELL_ENV,
                          comma-separated). Cells get PATH, LANG, LC_*, TERM, TZ and Cairn's own
                          variables, nothing else: no key reaches a cell unless named here
  --cell-hide PATH        one more path cells must not see (repeatable; CAIRN_CELL_HIDE, comma-separated)
  --cell-memory SIZE      memory of one cell's processes together (default 2GiB; e.g. 512MiB, 4GiB)
                          (CAIRN_CELL_MEMORY)
  --cell-processes N      processes one cell may have at once (default 512) (CAIRN_CELL_PROCESSES)`;

/** A size like 2GiB, 512MiB, 1.5G or a number of bytes. */
export function parseSize(command: string, name: string, text: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?$/i.exec(text.trim());
  if (m === null) throw new UsageError(`cairn ${command}: --${name} expects a size such as 512MiB or 2GiB, got "${text}".`);
  const unit = (m[2] ?? "b").toLowerCase();
  const mult = unit.startsWith("k") ? 1024 : unit.startsWith("m") ? 1024 ** 2 : unit.startsWith("g") ? 1024 ** 3 : 1;
  const bytes = Math.floor(Number(m[1]) * mult);
  if (bytes < 16 * 1024 ** 2) throw new UsageError(`cairn ${command}: --${name} must be at least 16MiB, got "${text}".`);
  return bytes;
}

const csv = (v: string | undefined): string[] => (v ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");

/**
 * The harness's sandbox options from flags and their CAIRN_ twins. `defaultMode` is the command's
 * (`required` for serve, `auto` otherwise); `hide` adds what only the CLI knows (the data dir, key files).
 */
export function sandboxOptions(p: Parsed, command: string, env: NodeJS.ProcessEnv, defaultMode: SandboxMode, hide: readonly string[]): SandboxOptions {
  const mode = str(p, "sandbox") ?? env.CAIRN_SANDBOX ?? defaultMode;
  if (mode !== "required" && mode !== "auto" && mode !== "none") throw new UsageError(`cairn ${command}: --sandbox expects required, auto or none, got "${mode}".`);
  const network = cellNetwork(p, command, env);
  // A flag may carry several names too (serve fills it from CAIRN_CELL_ENV, comma-separated).
  const passEnv = [...new Set([...list(p, "cell-env").flatMap(csv), ...csv(env.CAIRN_CELL_ENV)])];
  for (const name of passEnv) {
    if (!ENV_NAME.test(name)) throw new UsageError(`cairn ${command}: --cell-env expects a variable name (letters, digits, _), got "${name}".`);
  }
  const extraHide = [...new Set([...list(p, "cell-hide").flatMap(csv), ...csv(env.CAIRN_CELL_HIDE)])];
  const memoryText = str(p, "cell-memory") ?? env.CAIRN_CELL_MEMORY;
  const processesText = str(p, "cell-processes") ?? env.CAIRN_CELL_PROCESSES;
  let processes: number | undefined;
  if (processesText !== undefined) {
    processes = Number(processesText);
    if (!Number.isSafeInteger(processes) || processes < 8) throw new UsageError(`cairn ${command}: --cell-processes expects a whole number of at least 8, got "${processesText}".`);
  }
  return {
    mode,
    ...(network !== undefined ? { network } : {}),
    passEnv,
    hide: [...hide, ...extraHide],
    limits: {
      ...(memoryText !== undefined ? { memoryBytes: parseSize(command, "cell-memory", memoryText) } : {}),
      ...(processes !== undefined ? { processes } : {}),
    },
  };
}

/** `--cell-network` (or CAIRN_CELL_NETWORK), undefined when not given. */
export function cellNetwork(p: Parsed, command: string, env: NodeJS.ProcessEnv): CellNetwork | undefined {
  const v = str(p, "cell-network") ?? env.CAIRN_CELL_NETWORK;
  if (v === undefined || v === "") return undefined;
  if (v !== "off" && v !== "host") throw new UsageError(`cairn ${command}: --cell-network expects off or host, got "${v}".`);
  return v;
}

/** Files this process's settings name that cells must not see: the etcd client key and certificates, the HTTP token file. */
export function secretFiles(env: NodeJS.ProcessEnv, p?: Parsed): string[] {
  const flagged = p === undefined ? undefined : str(p, "token-file");
  return [env.CAIRN_ETCD_KEY, env.CAIRN_ETCD_CERT, env.CAIRN_ETCD_CA, env.CAIRN_TOKEN_FILE, flagged].filter((f): f is string => f !== undefined && f !== "");
}
