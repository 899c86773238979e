/**
 * `cairn effect`: the run's effect ledger, from inside a running cell (see docs/effects.md).
 *
 *   cairn effect begin NAME [--retry] [--json]   proceed | done RESULT | uncertain KNOWN
 *   cairn effect end NAME [--result JSON]        records the outcome (committed before it returns)
 *   cairn effect key NAME                        the run-wide idempotency key of NAME
 *
 * `begin` exits 0 only for `proceed`, so `cairn effect begin X && do-X` never repeats a done effect.
 */
import { flag, parse, str, UsageError } from "./args.js";
import { type CellAnswer, cellRequest } from "./cell-request.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";

/** Exit codes of `cairn effect begin` besides 0 (`proceed`) and the refusals' (2, 3, 4). */
export const EFFECT_EXIT = { done: 10, uncertain: 11 } as const;

const HELP = `usage: cairn effect begin NAME [--retry] [--json]
       cairn effect end NAME [--result JSON]
       cairn effect key NAME

Inside a running cell: the run's ledger of effects on the world outside (a pull request, a message,
a payment), so that a cell run again does not make one twice. A NAME belongs to the run: every cell
of the run gets the same answer for it.

begin   asks before making effect NAME, and prints one of:
          proceed             never begun: the begin is committed before this prints (exit 0)
          done RESULT         ended before, with this JSON result (exit ${EFFECT_EXIT.done})
          uncertain KNOWN     begun and never ended: it may have happened; check the outside
                              system, then \`end\` it or \`begin --retry\` it (exit ${EFFECT_EXIT.uncertain})
        --retry: for an uncertain effect that did not happen: begin it again (prints proceed).
        --json: print the harness's whole answer as JSON (the same exit codes).
end     records that NAME happened, with a small JSON result (default null); committed before
        this returns. Ending it again with the same result answers the same; another is refused.
key     prints NAME's idempotency key (a UUID): the same in every cell of the run and its forks,
        different in any other run. CAIRN_EFFECT_KEY holds this launch's own key.

Refusals (nothing recorded) exit 2 (bad name or result, never begun), 3 (this worker was fenced:
another owns the run) or 4 (the storage could not record it). Reads CAIRN_TIMER_SOCKET and
CAIRN_CELL_TOKEN, which the harness sets for each cell.`;

function refused(io: Io, what: string, r: Extract<CellAnswer, { ok: false }>): number {
  io.err(`cairn: effect ${what} refused: ${r.error}`);
  if (r.code === "reset") return EXIT.fenced;
  // The storage could not say (uncertain), was out of reach, full (rejected: retry later), or this worker is stopping.
  if (r.code === "uncertain" || r.code === "unavailable" || r.code === "rejected" || r.code === "stopping") return EXIT.storage;
  return EXIT.usage;
}

export async function effectCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("effect", argv, { retry: { type: "boolean" }, json: { type: "boolean" }, result: { type: "string" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  const [sub, name, ...extra] = p.positionals;
  if (sub === undefined) throw new UsageError("cairn effect: say begin, end or key, and the effect's name; see `cairn effect --help`.");
  if (name === undefined || name === "") throw new UsageError(`cairn effect ${sub}: give the effect's name, e.g. cairn effect ${sub} open-pr.`);
  if (extra.length > 0) throw new UsageError(`cairn effect ${sub}: one name only, got also ${extra.join(" ")}.`);
  const json = flag(p, "json");
  switch (sub) {
    case "begin": {
      if (str(p, "result") !== undefined) throw new UsageError("cairn effect begin: --result belongs to `cairn effect end`.");
      const r = await cellRequest("effect", io, "effect_begin", { name, ...(flag(p, "retry") ? { retry: true } : {}) });
      if (!r.ok) return refused(io, "begin", r);
      if (json) io.out(JSON.stringify(r));
      if (r.answer === "proceed") {
        if (!json) io.out("proceed");
        return EXIT.ok;
      }
      if (r.answer === "done") {
        if (!json) io.out(`done ${JSON.stringify(r.result ?? null)}`);
        return EFFECT_EXIT.done;
      }
      if (!json) io.out(`uncertain ${JSON.stringify(r.known ?? {})}`);
      return EFFECT_EXIT.uncertain;
    }
    case "end": {
      if (flag(p, "retry")) throw new UsageError("cairn effect end: --retry belongs to `cairn effect begin`.");
      const text = str(p, "result");
      let result: unknown = null;
      if (text !== undefined) {
        try {
          result = JSON.parse(text);
        } catch {
          throw new UsageError(`cairn effect end: --result must be JSON (quote a string: --result '"merged"'), got ${JSON.stringify(text.slice(0, 80))}.`);
        }
      }
      const r = await cellRequest("effect", io, "effect_end", { name, result });
      if (!r.ok) return refused(io, "end", r);
      io.out(json ? JSON.stringify(r) : `done ${JSON.stringify(r.result ?? null)}`);
      return EXIT.ok;
    }
    case "key": {
      const r = await cellRequest("effect", io, "effect_key", { name });
      if (!r.ok) return refused(io, "key", r);
      io.out(json ? JSON.stringify(r) : String(r.key));
      return EXIT.ok;
    }
    default:
      throw new UsageError(`cairn effect: unknown subcommand "${sub}"; the subcommands are begin, end and key.`);
  }
}
