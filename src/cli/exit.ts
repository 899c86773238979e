/**
 * Exit codes (documented in the README) and the one mapping from errors to them.
 *
 *   0  the run succeeded (or the command did what it was asked)
 *   1  the run ended in failure
 *   2  bad usage or configuration
 *   3  fenced: another process owns the database; do not restart here
 *   4  storage unavailable (or a commit's outcome is unknown: reopen to learn the truth)
 *   5  internal error: a bug in Cairn (the details are in the log; please report it)
 */
import { hasCode } from "../errors.js";

export const EXIT = { ok: 0, failure: 1, usage: 2, fenced: 3, storage: 4, internal: 5 } as const;
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** The exit code for an error, and one sentence to print (never a stack trace). */
export function describeError(err: unknown): { code: ExitCode; message: string } {
  const message = err instanceof Error ? err.message : String(err);
  if (hasCode(err, "reset")) return { code: EXIT.fenced, message };
  if (hasCode(err, "config") || hasCode(err, "usage") || hasCode(err, "not_found")) return { code: EXIT.usage, message: firstLine(message) };
  if (hasCode(err, "unavailable") || hasCode(err, "uncertain")) return { code: EXIT.storage, message: firstLine(message) };
  if (hasCode(err, "rejected")) return { code: EXIT.storage, message };
  if (hasCode(err, "model")) {
    const kind = (err as { kind?: string }).kind;
    return { code: kind === "config" || kind === "auth" ? EXIT.usage : EXIT.failure, message };
  }
  if (isZodError(err)) return { code: EXIT.usage, message: err.issues.map((i) => `${i.path.join(".") || "value"}: ${i.message}`).join("; ") };
  // Engine errors that escaped an adapter's mapping: a storage that cannot be used.
  const code = (err as { code?: unknown }).code;
  if (typeof code === "string" && /^(SQLITE_|ENOENT|EACCES|EROFS|ENOSPC|ECONNREFUSED)/.test(code)) return { code: EXIT.storage, message: firstLine(message) };
  // Anything else is a bug, not a failed run: its own code, one line here, the details in the log.
  return { code: EXIT.internal, message: `internal error (a bug in Cairn; rerun with --log-level debug or CAIRN_DEBUG=1 for details, and please report it): ${firstLine(message)}` };
}

/**
 * A zod validation error, recognised by its shape rather than `instanceof`, so that commands that
 * never validate anything (`cairn --version`) do not load zod just to map errors.
 */
function isZodError(err: unknown): err is Error & { issues: { path: PropertyKey[]; message: string }[] } {
  return err instanceof Error && err.name === "ZodError" && Array.isArray((err as { issues?: unknown }).issues);
}

/** The first line of a message, bounded: the CLI prints one sentence, details belong in the log. */
function firstLine(message: string): string {
  const line = message.split("\n", 1)[0] ?? "";
  return line.length > 600 ? `${line.slice(0, 597)}...` : line;
}
