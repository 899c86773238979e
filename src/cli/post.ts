/**
 * `cairn post`: delivers an outside observation to a run through the database's mailbox, without
 * taking ownership. The owner moves it into the run's inbox.
 */
import { parseLogEvent } from "../state/events.js";
import { Reducer } from "../state/reducer.js";
import { loadProjection } from "../storage/snapshots.js";
import { checkOutsideObservation, OutsideObservation, payloadProblem } from "../harness/observations.js";
import { flag, parse, required, UsageError } from "./args.js";
import type { Storage } from "../storage/contract.js";
import { START_REQUEST_KIND } from "../harness/start-request.js";
import { postOnce, startPending } from "../harness/operator.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

const HELP = `usage: cairn post --db NAME --session ID --id ID --kind KIND --payload JSON [--wait]

Delivers an outside observation to run ID. --id is your stable id: posting the same id and content
again is a no-op; the same id with other content is refused. Ids starting with execution:, timer:,
control: or idle: are reserved. A full inbox asks you to retry later (exit 4). The payload is at most
64 KiB of JSON, nested at most 32 levels.

The run's owner moves the message into the run's inbox; it may still refuse it then (the run ended
meanwhile, or the id was delivered with other content): \`cairn status\` lists such refusals.
  --wait                  wait until the owner delivered or refused it (exit 0 delivered, 2 refused,
                          4 when no owner took it within 5 minutes: it stays in the mailbox)
${STORAGE_HELP}`;

/** How long \`--wait\` waits for an owner to drain the mailbox. */
const WAIT_MS = 5 * 60_000;

export async function postCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("post", argv, { ...STORAGE_FLAGS, session: { type: "string" }, id: { type: "string" }, kind: { type: "string" }, payload: { type: "string" }, wait: { type: "boolean" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  const name = dbName(p, "post");
  const session = required(p, "post", "session", "the run to deliver to, e.g. s1");
  const id = required(p, "post", "id", "a stable id for this observation");
  const kind = required(p, "post", "kind", "what kind of observation, e.g. ci_result");
  const raw = required(p, "post", "payload", "a JSON value");
  let payload: unknown;
  try {
    payload = JSON.parse(raw);
  } catch {
    throw new UsageError(`cairn post: --payload is not valid JSON: ${raw.length > 80 ? `${raw.slice(0, 77)}...` : raw}`);
  }
  if (kind === START_REQUEST_KIND) throw new UsageError(`cairn post: --kind ${START_REQUEST_KIND} is reserved for start requests; use \`cairn submit\`.`);
  if (kind.startsWith("cairn.")) throw new UsageError(`cairn post: kinds starting with "cairn." are reserved for Cairn's own requests (cairn submit, pause, cancel, approve, fork...).`);
  const tooBig = payloadProblem(payload);
  if (tooBig !== null) throw new UsageError(`cairn post: ${tooBig}`);
  const obs = safeParseDeep(() => OutsideObservation.safeParse({ id, kind, payload }));
  if (!obs.success) throw new UsageError(`cairn post: ${obs.error.issues.map((i) => `--${i.path.join(".")}: ${i.message}`).join("; ")}`);
  const choice = await chooseStorage(p, "post", io.env);
  try {
    const { outcome, projection } = await postObservation(choice.storage, name, session, obs.data);
    switch (outcome.status) {
      case "unknown":
        throw new UsageError(`cairn post: ${outcome.message}`);
      case "refused":
        io.err(`cairn: ${outcome.message}`);
        return EXIT.usage;
      case "duplicate":
      case "waiting_start":
        io.out(outcome.message);
        return EXIT.ok;
      case "posted":
        io.out(outcome.message);
        if (!flag(p, "wait")) return EXIT.ok;
        return await waitForDelivery(choice.storage, name, session, id, projection, io);
    }
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}

/** What became of a posted observation (`refused`: nothing was posted; `message` says why). */
export type PostOutcome =
  | { readonly status: "posted" | "duplicate" | "waiting_start"; readonly message: string }
  | { readonly status: "unknown"; readonly message: string }
  | { readonly status: "refused"; readonly reason: "forged" | "conflict" | "inbox_full" | "ended" | "invalid"; readonly message: string };

/**
 * Posts outside observation `obs` to run `session` of database `name` through the mailbox, as
 * `cairn post` and `POST /api/v1/runs/{id}/observations` do, after checking what can be checked
 * without ownership (the run exists or waits to be started; the id is not reserved, not delivered
 * with other content; the run has not ended). The same id and content again is a no-op
 * (`duplicate` once delivered; the same message while it still waits in the mailbox). Returns the
 * outcome and the projection it judged from (for following the delivery). Throws ConfigError when
 * the id waits in the mailbox with other content, and the storage's errors.
 */
export async function postObservation(storage: Storage, name: string, session: string, obs: OutsideObservation, now: Date = new Date()): Promise<{ outcome: PostOutcome; projection: Reducer }> {
  const reader = await storage.reader(name);
  let r;
  try {
    r = await loadProjection(reader);
  } finally {
    await reader.close().catch(() => undefined);
  }
  const message = { id: obs.id, session, kind: obs.kind, payload: obs.payload, at: now.toISOString() };
  const s = r.session(session);
  if (s === undefined) {
    // A run submitted and not started yet: its owner starts it first, then delivers this.
    if (!(await startPending(storage, name, session))) return { outcome: { status: "unknown", message: `run "${session}" does not exist in database "${name}".` }, projection: r };
    await postOnce(storage, name, message);
    return { outcome: { status: "waiting_start", message: `posted ${obs.id} to ${session} in "${name}"; the run waits to be started, and its owner delivers it after the start` }, projection: r };
  }
  const check = checkOutsideObservation(s, obs, Number.MAX_SAFE_INTEGER);
  if (!check.ok) return { outcome: { status: "refused", reason: check.reason, message: check.message }, projection: r };
  if (check.duplicate) return { outcome: { status: "duplicate", message: `observation ${obs.id} was already delivered to ${session}; nothing to do` }, projection: r };
  await postOnce(storage, name, message);
  return { outcome: { status: "posted", message: `posted ${obs.id} to ${session} in "${name}"; its owner delivers it to the run's inbox` }, projection: r };
}

/** Follows the log until the owner delivered (`inbox_received`) or refused (`post_refused`) the message. */
async function waitForDelivery(storage: Storage, name: string, session: string, id: string, r: Reducer, io: Io): Promise<number> {
  const deadline = Date.now() + WAIT_MS;
  const refusedBefore = r.session(session)?.refused_posts.filter((x) => x.id === id).length ?? 0;
  for (;;) {
    const reader = await storage.reader(name);
    try {
      for (;;) {
        const batch = await reader.read(r.headSeq, 5000);
        if (batch.length === 0) break;
        r.apply(batch.map((e) => parseLogEvent(e)));
      }
    } finally {
      await reader.close().catch(() => undefined);
    }
    const s = r.session(session)!;
    if (s.observations.has(id)) {
      io.out(`delivered ${id} to the inbox of ${session}`);
      return EXIT.ok;
    }
    const refused = s.refused_posts.filter((x) => x.id === id);
    if (refused.length > refusedBefore) {
      io.err(`cairn: the owner refused ${id}: ${refused[refused.length - 1]!.reason}`);
      return EXIT.usage;
    }
    if (Date.now() >= deadline) {
      io.err(`cairn: ${id} was not delivered within ${WAIT_MS / 60_000} minutes: no owner drained the mailbox (is \`cairn run\`, \`resume\` or \`serve\` running for "${name}"?); it stays in the mailbox.`);
      return EXIT.storage;
    }
    await new Promise((res) => setTimeout(res, 200));
  }
}

/** zod recurses through the payload: a pathologically deep one is bad input, not an internal error. */
function safeParseDeep<T>(parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    if (err instanceof RangeError) throw new UsageError("cairn post: --payload is nested too deeply; keep it under a few hundred levels.");
    throw err;
  }
}
