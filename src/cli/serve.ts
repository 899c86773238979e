/**
 * `cairn serve`: the long-running worker a job scheduler starts. Opens the database (taking it over),
 * resumes unfinished runs, serves /metrics, /healthz and /readyz, idles at near-zero CPU, shuts down
 * cleanly on SIGTERM, and exits 3 when fenced.
 */
import { Harness } from "../harness/harness.js";
import { Metrics } from "../observability/metrics.js";
import { startObservabilityServer } from "../observability/server.js";
import { parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { makeLogger, makeModel } from "./run.js";
import { chaosFaults } from "./chaos.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

/** How long a fenced worker keeps /readyz (503) and /metrics up before it exits 3. */
const FENCED_LINGER_MS = 1500;

const HELP = `usage: cairn serve --db NAME --model SPEC [--listen HOST:PORT] [--log-level LEVEL]

The worker a job scheduler runs: takes database NAME over, resumes its unfinished runs, and serves
/metrics (Prometheus), /healthz (alive) and /readyz (owns the database and reaches its storage) on
--listen (default 127.0.0.1:9464). SIGTERM: stop launching, stop running cells (recorded as they
are), close the storage, exit 0. Fenced by another opener: exit 3; do not restart it here.
${STORAGE_HELP}
  --model SPEC            as for cairn run
  --base-url URL          the provider's base URL
  --log-level LEVEL       default info; JSON lines on stderr (human-readable on a terminal)`;

export async function serveCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("serve", argv, { ...STORAGE_FLAGS, model: { type: "string" }, "base-url": { type: "string" }, listen: { type: "string" }, "log-level": { type: "string" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn serve takes no goal; it resumes the runs already in the database.`);
  const name = dbName(p, "serve");
  const logger = makeLogger(p, "info");
  const model = makeModel(p, "serve", io.env);
  const listen = str(p, "listen") ?? "127.0.0.1:9464";
  const choice = await chooseStorage(p, "serve", io.env, logger);
  const metrics = new Metrics({ adapter: choice.adapter });
  let h: Harness;
  try {
    const faults = chaosFaults(io.env);
    h = await Harness.open({ storage: choice.storage, name, model, workDir: choice.dataDir, logger, metrics, ...(faults ? { faults } : {}) });
  } catch (err) {
    await choice.storage.close().catch(() => undefined);
    throw err;
  }
  metrics.onScrape(() => {
    if (h.status === "open") h.refreshMetrics();
  });
  const server = await startObservabilityServer({
    listen,
    metrics,
    logger,
    ready: () => (h.status === "open" ? { ready: true, reason: `owns "${name}" at epoch ${h.epoch}` } : { ready: false, reason: `${h.status}: this process no longer owns "${name}"` }),
  });
  logger.info({ url: server.url, epoch: h.epoch }, "serving");
  io.err(`cairn: serving database "${name}" (${choice.describe}) at epoch ${h.epoch}; metrics on ${server.url}/metrics`);
  const stopped = new Promise<"fenced" | "poisoned" | "closed">((resolve) => h.onStop((status) => resolve(status === "open" ? "closed" : status)));
  const terminated = new Promise<"term">((resolve) => {
    process.once("SIGTERM", () => resolve("term"));
    process.once("SIGINT", () => resolve("term"));
  });
  try {
    await h.resume();
    const why = await Promise.race([stopped, terminated]);
    if (why === "fenced") {
      logger.error({ db: name }, "fenced: another process opened the database; exiting with code 3 (do not restart here)");
      io.err(`cairn: fenced: another process opened database "${name}"; exiting. Do not restart it here unless the other owner is gone.`);
      // Keep answering for a moment: /readyz says why (503) and a scrape can see the fence counter.
      await new Promise((r) => setTimeout(r, FENCED_LINGER_MS));
      return EXIT.fenced;
    }
    if (why === "poisoned") {
      io.err(`cairn: a commit's outcome is unknown; exiting so that a fresh process can reopen "${name}" and read the truth.`);
      return EXIT.storage;
    }
    logger.info({}, "SIGTERM: shutting down");
    return EXIT.ok;
  } finally {
    await h.close();
    await server.close();
    await model.close?.().catch(() => undefined);
    await choice.storage.close().catch(() => undefined);
  }
}
