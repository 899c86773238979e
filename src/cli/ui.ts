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
import { parseListen } from "../observability/server.js";
import { ACCESS_FLAGS, ACCESS_HELP, accessFromFlags } from "./http-access.js";
import { fillFromEnv } from "./owner.js";

const HELP = `usage: cairn ui --db NAME [--listen HOST:PORT] [--allow-host NAME] [--token-file FILE | --no-auth]

Serves the timeline page of database NAME at http://HOST:PORT/ (default 127.0.0.1:9465): its runs,
and for each a timeline of rounds and cells on a time axis, coloured by outcome, UnknownExecutions
marked, ownership changes as vertical lines; click a bar for a cell's output or a round's patch. New
events stream in as they commit. Reads only: never takes ownership. Stops on Ctrl-C or SIGTERM.
The page shows every run's transcripts: it answers only to this server's own Host names, and needs a
token when one is set (CAIRN_UI_TOKEN, --token-file) or when --listen is not a loopback address.
${STORAGE_HELP}
  --listen HOST:PORT      where to serve (port 0 picks a free one)
${ACCESS_HELP}`;

export async function uiCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("ui", argv, { ...STORAGE_FLAGS, ...ACCESS_FLAGS, listen: { type: "string" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn ui takes no arguments besides flags, got "${p.positionals.join(" ")}".`);
  const name = dbName(p, "ui");
  const listen = str(p, "listen") ?? "127.0.0.1:9465";
  let bindHost: string;
  try {
    bindHost = parseListen(listen).host;
  } catch (err) {
    throw new UsageError(`cairn ui: ${(err as Error).message}`);
  }
  fillFromEnv(p, "ui", io.env, ACCESS_FLAGS);
  const access = accessFromFlags(p, "ui", io.env, bindHost, "the timeline page and every run's transcripts (cells' output, patches)");
  const tokened = access.policy.token !== null;
  const choice = await chooseStorage(p, "ui", io.env);
  try {
    // Fail now, with a sentence, when the database does not exist (DatabaseNotFound: exit 2).
    await (await choice.storage.reader(name)).close();
    const handler = createTimelineHandler({ storage: choice.storage, databases: async () => [name] });
    const server = await startPageServer(listen, handler, { access: access.policy });
    try {
      if (access.notice !== null) for (const line of access.notice.split("\n")) io.err(line);
      io.err(`cairn: timeline of database "${name}" (${choice.describe}) at ${server.url}/${tokened ? "?token=TOKEN" : ""}; reading only. Ctrl-C to stop.`);
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
