/**
 * Turning a cell into the argv that runs it, or into the reason it cannot be launched on this machine.
 *
 * cmd cells: the argv itself (never a shell); the executable must exist.
 * script cells: the source is written to a file of its own, `<scriptDir>/cell-<id>-<random>.py`
 * (scriptDir checked to be ours and 0700, the file created with O_EXCL and O_NOFOLLOW, mode 0600:
 * never a path two launches share, never written through a planted link), then run with
 * `uv run --script FILE` when uv is on PATH; without uv, only a script that declares no dependencies
 * can run, with `python3 FILE`, and only when python3 satisfies its `requires-python`.
 */
import { execa } from "execa";
import { randomBytes } from "node:crypto";
import { isAbsolute, join, resolve } from "node:path";
import { parsePep723, satisfiesRequiresPython } from "../state/pep723.js";
import { ensurePrivateDir, writeNewFile } from "./private.js";
import { isExecutableFile } from "./which.js";

/** The cell part of a launch. */
export type LaunchCell = { kind: "cmd"; argv: string[] } | { kind: "script"; source: string };

/** What a launch resolves to: the argv to exec, extra env, or why it cannot run. */
export type ResolvedLaunch =
  | { ok: true; argv: string[]; env: Record<string, string>; script?: { readonly path: string; readonly deps: readonly string[] } }
  | { ok: false; detail: string };

/** What {@link resolveLaunch} needs from the world. */
export interface LaunchDeps {
  /** Absolute path of a bare command name on PATH, or null. */
  readonly which: (cmd: string) => string | null;
  /** `python3 --version`'s version ("3.11.7"), or null when it cannot be run. Cached by the caller. */
  readonly pythonVersion: (python3: string) => Promise<string | null>;
}

/** The sentence every "needs uv" refusal carries. */
export const UV_HELP =
  "uv is needed to run scripts that declare dependencies (or a Python that python3 does not provide) and it is not on PATH; install it (https://docs.astral.sh/uv/ : `pipx install uv`, or the standalone installer `curl -LsSf https://astral.sh/uv/install.sh | sh`) and make sure `uv` is on the PATH of the Cairn process";

/** A new path for a script cell's source: its own for every launch. */
export function scriptPath(scriptDir: string, cellId: number): string {
  return join(scriptDir, `cell-${cellId}-${randomBytes(6).toString("hex")}.py`);
}

/** Runs `python3 --version` and returns "X.Y.Z", or null when it fails. */
export async function probePythonVersion(python3: string): Promise<string | null> {
  try {
    const r = await execa(python3, ["--version"], { reject: false, timeout: 10_000, stdin: "ignore" });
    const text = `${String(r.stdout ?? "")} ${String(r.stderr ?? "")}`;
    const m = /Python\s+(\d+\.\d+(?:\.\d+)?)/.exec(text);
    return m?.[1] ?? null;
  } catch (_err) {
    return null;
  }
}

/**
 * Resolves a cell to an argv (executable first) in `cwd`. Script cells get their file written here.
 * Never throws for a cell that cannot run: that is `{ok:false, detail}`. Throws only on I/O failure
 * writing the script file.
 */
export async function resolveLaunch(
  cell: LaunchCell,
  where: { cellId: number; cwd: string; scriptDir: string },
  deps: LaunchDeps,
): Promise<ResolvedLaunch> {
  if (cell.kind === "cmd") {
    const [cmd] = cell.argv;
    if (cmd === undefined || cmd === "") return { ok: false, detail: "empty argv: a cmd cell needs at least the command to run" };
    if (cmd.includes("/")) {
      const full = isAbsolute(cmd) ? cmd : resolve(where.cwd, cmd);
      if (!isExecutableFile(full)) return { ok: false, detail: `no such command: ${cmd} (not an executable file: ${full})` };
    } else if (deps.which(cmd) === null) {
      return { ok: false, detail: `no such command: ${cmd} (not found on PATH)` };
    }
    // The argv is passed unchanged, so argv[0] keeps the name the model wrote.
    return { ok: true, argv: [...cell.argv], env: {} };
  }

  const file = scriptPath(where.scriptDir, where.cellId);
  ensurePrivateDir(where.scriptDir);
  writeNewFile(file, cell.source);
  // Unbuffered, so a slow script's output is captured as it goes rather than at exit.
  const env = { PYTHONUNBUFFERED: "1" };
  const parsed = parsePep723(cell.source);

  const uv = deps.which("uv");
  if (uv !== null) return { ok: true, argv: [uv, "run", "--script", file], env, script: { path: file, deps: parsed.ok && parsed.block !== null ? parsed.block.dependencies : [] } };

  if (!parsed.ok) return { ok: false, detail: `the script's PEP 723 block is invalid (${parsed.reason}), and ${UV_HELP}` };
  const block = parsed.block;
  if (block !== null && block.dependencies.length > 0) {
    return { ok: false, detail: `the script declares dependencies (${block.dependencies.join(", ")}): ${UV_HELP}` };
  }
  const python3 = deps.which("python3");
  if (python3 === null) return { ok: false, detail: `neither uv nor python3 is on PATH: ${UV_HELP}` };
  if (block !== null && block.requiresPython !== null) {
    const version = await deps.pythonVersion(python3);
    if (version === null) {
      return { ok: false, detail: `cannot tell the version of ${python3} to check requires-python "${block.requiresPython}", and ${UV_HELP}` };
    }
    let satisfied: boolean;
    try {
      satisfied = satisfiesRequiresPython(block.requiresPython, version);
    } catch (err) {
      return { ok: false, detail: `cannot check requires-python "${block.requiresPython}" against python3 ${version} (${(err as Error).message}), and ${UV_HELP}` };
    }
    if (!satisfied) {
      return {
        ok: false,
        detail: `the script requires-python "${block.requiresPython}" but python3 is ${version}; ${UV_HELP}`,
      };
    }
  }
  return { ok: true, argv: [python3, file], env, script: { path: file, deps: [] } };
}
