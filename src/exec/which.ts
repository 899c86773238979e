/**
 * Finding an executable the way a shell's PATH lookup does, without running a shell.
 */
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, isAbsolute, join, resolve } from "node:path";

/** True when `path` is a regular file this process may execute. */
export function isExecutableFile(path: string): boolean {
  try {
    // No exception for the common miss (a PATH directory without the command): building one costs
    // more than the stat itself, and a lookup misses in most directories before it hits.
    const stat = statSync(path, { throwIfNoEntry: false });
    if (stat === undefined || !stat.isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch (_err) {
    return false;
  }
}

/**
 * The absolute path of `cmd`: a name containing "/" is resolved against `cwd`; a bare name is searched
 * in `pathEnv` (default `process.env.PATH`), first match wins. Null when not found or not executable.
 */
export function which(cmd: string, options: { pathEnv?: string; cwd?: string } = {}): string | null {
  if (cmd === "") return null;
  if (cmd.includes("/")) {
    const full = isAbsolute(cmd) ? cmd : resolve(options.cwd ?? process.cwd(), cmd);
    return isExecutableFile(full) ? full : null;
  }
  const pathEnv = options.pathEnv ?? process.env.PATH ?? "";
  for (const dir of pathEnv.split(delimiter)) {
    if (dir === "") continue;
    const candidate = join(dir, cmd);
    if (isExecutableFile(candidate)) return isAbsolute(candidate) ? candidate : resolve(candidate);
  }
  return null;
}
