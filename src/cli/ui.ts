/**
 * `cairn ui`: serves the timeline page for a database without owning anything (a Reader only), for
 * a database no worker is serving, or to look at one without touching the worker.
 */
import { parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";
import { createTimelineHandler } from "../ui/server.js";
import { startPageServer } from "../ui/http.js";

const HELP = `usage: cairn ui --db NAME [--listen HOST:PORT]

Serves the timeline page of database NAME at http://HOST:PORT/ (default 127.0.0.1:9465): its runs,
and for each a timeline of rounds and cells on a time axis, coloured by outcome, UnknownExecutions
marked, ownership changes as vertical lines; click a bar for a cell's output or a round's patch. New
events stream in as they commit. Reads only: never takes ownership. Set CAIRN_UI_TOKEN to require
?token=TOKEN. Stops on Ctrl-C or SIGTERM.
${STORAGE_HELP}
  --listen HOST:PORT      where to serve (port 0 picks a free one)`;

export async function uiCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("ui", argv, { ...STORAGE_FLAGS, listen: { type: "string" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn ui takes no arguments besides flags, got "${p.positionals.join(" ")}".`);
  const name = dbName(p, "ui");
  const listen = str(p, "listen") ?? "127.0.0.1:9465";
  const choice = await chooseStorage(p, "ui", io.env);
  try {
    // Fail now, with a sentence, when the database does not exist (DatabaseNotFound: exit 2).
    await (await choice.storage.reader(name)).close();
    const handler = createTimelineHandler({ storage: choice.storage, databases: async () => [name], ...(io.env.CAIRN_UI_TOKEN ? { token: io.env.CAIRN_UI_TOKEN } : {}) });
    const server = await startPageServer(listen, handler);
    try {
      io.err(`cairn: timeline of database "${name}" (${choice.describe}) at ${server.url}/${io.env.CAIRN_UI_TOKEN ? "?token=..." : ""}; reading only. Ctrl-C to stop.`);
      let stop = (): void => undefined;
      try {
        await new Promise<void>((resolve) => {
          stop = resolve;
          process.once("SIGINT", stop);
          process.once("SIGTERM", stop);
        });
      } finally {
        process.off("SIGINT", stop);
        process.off("SIGTERM", stop);
      }
      return EXIT.ok;
    } finally {
      await server.close();
    }
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}
