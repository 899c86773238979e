/**
 * `cairn log`: the timeline of a database's runs, read through a Reader (never taking ownership):
 * rounds, cells, UnknownExecutions and their resolutions, timers, posts, controls, ownership changes
 * and each run's end. Aligned, relative times, colour only on a terminal (NO_COLOR turns it off,
 * FORCE_COLOR on); `--json` prints the stored events exactly, one JSON document per line;
 * `--follow` keeps printing events as they commit. Recorded text (a cell's output, a model's words)
 * is printed with its control characters made visible; `--raw` prints it as stored.
 */
import type { LogEvent } from "../state/events.js";
import type { Storage } from "../storage/contract.js";
import { LogText, concernsCell } from "../ui/logtext.js";
import { followHistory, readHistory } from "../ui/source.js";
import { flag, parse, positiveInt, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

const HELP = `usage: cairn log --db NAME [--session ID] [--cell N] [--follow] [--json | --raw]

Prints what happened in database NAME, in commit order: each run's rounds (attempts, refused patches
and why, tokens, model time), cells (where they started: host and epoch; duration, exit, output,
truncation marked), UnknownExecutions and their resolutions, timers, posts, control notes, ownership
changes and the run's end. Times are relative to the run's start. Reads only: the owner keeps running.
What cells and models wrote is shown with control characters made visible (ESC as \\x1b, CR as
\\x0d, bidirectional overrides as \\u202e, ...; tab and newline kept), so that nothing a cell printed
can move the cursor, retitle the terminal or overprint these lines.
  --session ID            only this run
  --cell N                only what concerns cell N (its patch, start, output, end, resolution)
  --follow                keep printing events as they commit (Ctrl-C to stop); with --session,
                          stops when that run has ended
  --json                  the stored events, exactly, one JSON object per line
  --raw                   recorded text as stored, control characters included (they act on the
                          terminal: for a file or \`less -R\`, not for output you do not trust)
  --poll-ms N             --follow: how often to look for new events (default 250)
Colour is used only when stdout is a terminal; NO_COLOR=1 turns it off, FORCE_COLOR=1 on.
${STORAGE_HELP}`;

/** What `cairn log` prints and from where; `signal` stops `--follow`. */
export interface LogOptions {
  readonly storage: Storage;
  readonly name: string;
  readonly session?: string;
  readonly cell?: number;
  readonly follow: boolean;
  readonly json: boolean;
  readonly color: boolean;
  /** Recorded text as stored, control characters included (default false: made visible). */
  readonly raw?: boolean;
  readonly pollMs: number;
  readonly signal: AbortSignal;
}

/** Whether to colour: never with NO_COLOR or a dumb terminal, always with FORCE_COLOR, else on a TTY. */
export function useColor(env: NodeJS.ProcessEnv, isTTY: boolean): boolean {
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== "") return false;
  if (env.FORCE_COLOR !== undefined && env.FORCE_COLOR !== "" && env.FORCE_COLOR !== "0") return true;
  if (env.TERM === "dumb") return false;
  return isTTY;
}

/**
 * Prints the log of `options.name` through `out`, then, with `follow`, every new event until
 * `signal` aborts (or, with `session`, until that run has ended). Works on every adapter: it needs
 * only `Storage.reader`. Throws DatabaseNotFound for a missing database, UsageError for a missing session.
 */
export async function printLog(options: LogOptions, out: (line: string) => void): Promise<void> {
  const reader = await options.storage.reader(options.name);
  try {
    const text = new LogText({ color: options.color, raw: options.raw === true, ...(options.session !== undefined ? { session: options.session } : {}), ...(options.cell !== undefined ? { cell: options.cell } : {}) });
    let ended = false;
    const emit = (events: readonly LogEvent[], raw: readonly LogEvent[]): void => {
      if (options.json) {
        // Raw as stored (not re-serialized from the parsed copy): the output round-trips exactly.
        for (let i = 0; i < raw.length; i++) {
          const e = events[i]!;
          text.timeline.apply([e]);
          if (options.session !== undefined && e.session !== options.session) continue;
          if (options.cell !== undefined && !concernsCell(e, options.cell)) continue;
          out(JSON.stringify(raw[i]));
        }
      } else {
        for (const line of text.render(events)) out(line);
      }
      if (options.session !== undefined && events.some((e) => e.kind === "run_ended" && e.session === options.session)) ended = true;
    };
    const head = await readHistory(reader, 0, emit);
    if (options.session !== undefined && text.timeline.view(options.session) === undefined && !options.follow) {
      const have = text.timeline.views().map((v) => v.id);
      throw new UsageError(`session "${options.session}" does not exist in database "${options.name}" (it has ${have.join(", ") || "no sessions"}).`);
    }
    if (options.cell !== undefined && !options.follow) {
      const views = options.session !== undefined ? [text.timeline.view(options.session)] : text.timeline.views();
      const known = views.some((v) => v?.cells.some((c) => c.id === options.cell) || v?.rounds.some((r) => r.new_cells.some((c) => c.id === options.cell)));
      if (!known) throw new UsageError(`cell ${options.cell} does not exist in ${options.session !== undefined ? `session "${options.session}"` : `database "${options.name}"`}; \`cairn status --db ${options.name}\` lists the cells.`);
    }
    if (!options.follow || ended) return;
    const stop = new AbortController();
    const onAbort = (): void => stop.abort();
    options.signal.addEventListener("abort", onAbort, { once: true });
    try {
      await followHistory(reader, head, options.pollMs, stop.signal, (events, raw) => {
        emit(events, raw);
        if (ended) stop.abort();
      });
    } finally {
      options.signal.removeEventListener("abort", onAbort);
    }
  } finally {
    await reader.close().catch(() => undefined);
  }
}

export async function logCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("log", argv, {
    ...STORAGE_FLAGS,
    session: { type: "string" },
    cell: { type: "string" },
    follow: { type: "boolean", short: "f" },
    json: { type: "boolean" },
    raw: { type: "boolean" },
    "poll-ms": { type: "string" },
  });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn log takes no arguments besides flags, got "${p.positionals.join(" ")}".`);
  const name = dbName(p, "log");
  const session = str(p, "session");
  if (session === "") throw new UsageError("cairn log: --session is empty; give a run id such as s1 (`cairn status` lists them).");
  const cell = positiveInt(p, "log", "cell");
  const pollMs = positiveInt(p, "log", "poll-ms") ?? 250;
  const choice = await chooseStorage(p, "log", io.env);
  const abort = new AbortController();
  const stop = (): void => abort.abort();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  try {
    await printLog(
      {
        storage: choice.storage,
        name,
        ...(session !== undefined ? { session } : {}),
        ...(cell !== undefined ? { cell } : {}),
        follow: flag(p, "follow"),
        json: flag(p, "json"),
        raw: flag(p, "raw"),
        color: !flag(p, "json") && useColor(io.env, io.isTTY ?? process.stdout.isTTY === true),
        pollMs,
        signal: abort.signal,
      },
      io.out,
    );
    return EXIT.ok;
  } finally {
    process.off("SIGINT", stop);
    process.off("SIGTERM", stop);
    await choice.storage.close().catch(() => undefined);
  }
}
