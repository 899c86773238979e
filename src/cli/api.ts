/**
 * The HTTP API of `cairn serve` (docs/api.md): programs submit runs, read their status and events,
 * follow them live (Server-Sent Events), post observations, and pause, unpause, cancel, approve or
 * deny, on the same port as /metrics and behind the same access gate (src/observability/access.ts).
 *
 * It is the CLI's implementation behind HTTP: each route calls the function its command calls
 * (`submitRun` of `cairn submit`, `postObservation` of `cairn post`, `steerRun` of `cairn pause` and
 * the others, the `summarize` projection of `cairn status`, the `readHistory` pages of `cairn log`).
 * So a request is one mailbox message the owner applies as one atomic commit: nothing is
 * half-applied, and it works on a standby worker too (the owner, wherever it runs, applies it).
 *
 * The API needs a token: a server started without one (loopback, no --token-file or CAIRN_UI_TOKEN)
 * answers 401 saying how to set one, since a submitted run runs code. Every refusal is a JSON body
 * `{"error": {"code", "message"}}` whose message says what was wrong and what to do.
 */
import { createHash } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import { z } from "zod";
import { API_PREFIX, ApiError, BODY_TIMEOUT_MS, MAX_STREAMS, intParam, sameOrigin, listing, match, parseBody, readBody, requestId, sendApiError, sendJson, type ApiContext, type ApiRequest, type Route } from "./api-http.js";

import type { LogEvent } from "../state/events.js";
import { Budgets } from "../state/events.js";
import { SteerRequest } from "../state/steer.js";
import { parseRule } from "../state/approval.js";
import type { Storage } from "../storage/contract.js";
import { hasCode } from "../errors.js";
import { summarize, summarizeSession } from "../harness/inspect.js";
import { forkRun, readProjection, startPending, steerRun, type RequestOutcome } from "../harness/operator.js";
import { START_REQUEST_KIND, StartRequest, checkUserSessionId } from "../harness/start-request.js";
import { OutsideObservation, payloadProblem } from "../harness/observations.js";
import { followHistory, readHistory } from "../ui/source.js";
import { requestTarget } from "../observability/access.js";
import { UsageError } from "./args.js";
import { submitRun } from "./submit.js";
import { postObservation } from "./post.js";

// What a route added to the table (ApiOptions.routes) is written with.
export { API_PREFIX, ApiError, type ApiContext, type ApiReply, type ApiRequest, type Route } from "./api-http.js";

export interface ApiOptions {
  readonly storage: Storage;
  readonly name: string;
  readonly logger: Logger;
  /** Whether a token is in force on this server; without one the API answers 401. */
  readonly tokenInForce: boolean;
  readonly waitMs?: number;
  readonly pollMs?: number;
  readonly heartbeatMs?: number;
  /** How long a request body may take to arrive (default BODY_TIMEOUT_MS). */
  readonly bodyTimeoutMs?: number;
  /** Routes added to the table (after the built-in ones). */
  readonly routes?: readonly Route[];
}

/** Mounted on the observability server: `handle` resolves false for a path outside /api/v1/. */
export interface ApiHandler {
  handle(req: IncomingMessage, res: ServerResponse): Promise<boolean>;
  /** Ends open event streams. */
  close(): Promise<void>;
}

// ---- bodies -------------------------------------------------------------------------------

const RequestIdField = z.string().optional();
const WaitField = z.number().min(0).max(300).optional();

const SubmitBody = z.strictObject({
  goal: z.string(),
  session: z.string().optional(),
  id: RequestIdField,
  validators: z.array(z.array(z.string()).min(1)).max(32).optional(),
  budgets: Budgets.optional(),
  cell_network: z.enum(["off", "host"]).optional(),
  require_approval: z.array(z.string()).max(32).optional(),
});
const ObservationBody = z.strictObject({ id: z.string().optional(), kind: z.string(), payload: z.unknown() });
const PauseBody = z.strictObject({ reason: z.string().max(2000).optional(), now: z.boolean().optional(), id: RequestIdField, wait_seconds: WaitField });
const PlainBody = z.strictObject({ reason: z.string().max(2000).optional(), id: RequestIdField, wait_seconds: WaitField });
const ForkBody = z.strictObject({ at_round: z.number().int().min(0), new_session: z.string().optional(), reason: z.string().max(2000).optional(), id: RequestIdField, wait_seconds: WaitField });

/**
 * The run id of a submit that names none but carries a request id: derived from it, so that a
 * retry of the same submit finds the same run instead of starting another.
 */
export function sessionForKey(key: string): string {
  return `k-${createHash("sha256").update(key).digest("hex").slice(0, 16)}`;
}

// ---- routes -------------------------------------------------------------------------------

/** The run `id` exists, or waits in the mailbox to be started; otherwise 404. */
async function knownRun(api: ApiContext, id: string): Promise<"started" | "pending"> {
  const p = await readProjection(api.storage, api.name);
  if (p.session(id) !== undefined) return "started";
  if (await startPending(api.storage, api.name, id)) return "pending";
  throw new ApiError(404, "unknown_run", `run "${id}" does not exist in database "${api.name}"; GET ${API_PREFIX}runs lists the runs`);
}

const submit: Route = {
  method: "POST",
  path: "/api/v1/runs",
  summary: "submit a run",
  async handle(r) {
    const b = parseBody(SubmitBody, r.body);
    if (b.goal.trim() === "") throw new ApiError(400, "bad_field", `field "goal" is empty: say what the agent should achieve`);
    const key = requestId(r, b.id);
    const session = b.session ?? (key !== undefined ? sessionForKey(key) : undefined);
    if (b.session !== undefined) {
      const bad = checkUserSessionId(b.session);
      if (bad !== null) throw new ApiError(400, "bad_field", bad.replace(/^--session/, `field "session"`));
    }
    const approval = (b.require_approval ?? []).map((text) => {
      const rule = parseRule(text);
      if (typeof rule === "string") throw new ApiError(400, "bad_field", `field "require_approval": ${rule}`);
      return rule;
    });
    const parsed = StartRequest.safeParse({
      goal: b.goal,
      validators: b.validators ?? [],
      budgets: b.budgets ?? {},
      ...(b.cell_network === "host" ? { cell_network: "host" } : {}),
      ...(approval.length > 0 ? { approval } : {}),
    });
    if (!parsed.success) throw new ApiError(400, "bad_field", parsed.error.issues.map((i) => `field "${i.path.join(".")}": ${i.message}`).join("; "));
    let o;
    try {
      o = await submitRun(r.api.storage, r.api.name, parsed.data, session);
    } catch (err) {
      if (err instanceof UsageError) throw new ApiError(409, "conflict", err.message);
      throw err;
    }
    r.api.logger.info({ session: o.session, status: o.status }, "api: submit");
    const self = `${API_PREFIX}runs/${encodeURIComponent(o.session)}`;
    return { status: o.status === "submitted" ? 201 : 200, body: { run: o.session, status: o.status, message: o.message, links: { self, events: `${self}/events` } }, headers: { location: self } };
  },
};

const listRuns: Route = {
  method: "GET",
  path: "/api/v1/runs",
  summary: "list the runs",
  async handle(r) {
    const p = await readProjection(r.api.storage, r.api.name);
    const i = summarize(r.api.name, p.projection());
    return {
      status: 200,
      body: {
        db: i.db,
        head: i.head,
        runs: i.sessions.map((s) => ({ id: s.id, goal: s.goal, status: s.status, created_at: s.created_at, rounds: s.rounds, result: s.result })),
        pending_starts: await pendingStarts(r.api),
      },
    };
  },
};

async function pendingStarts(api: ApiContext): Promise<{ run: string; goal: string; submitted_at: string }[]> {
  const reader = await api.storage.reader(api.name);
  try {
    return ((await reader.pending?.()) ?? [])
      .filter((m) => m.kind === START_REQUEST_KIND)
      .map((m) => {
        const s = StartRequest.safeParse(m.payload);
        return { run: m.session, goal: s.success ? s.data.goal : "(malformed request)", submitted_at: m.at };
      });
  } finally {
    await reader.close().catch(() => undefined);
  }
}

const getRun: Route = {
  method: "GET",
  path: "/api/v1/runs/{id}",
  summary: "a run's status (the cairn.status/1 run)",
  async handle(r) {
    const id = r.params.id!;
    const p = await readProjection(r.api.storage, r.api.name);
    const s = p.session(id);
    if (s !== undefined) return { status: 200, body: { db: r.api.name, head: p.headSeq, run: summarizeSession(s, r.api.name) } };
    const waiting = (await pendingStarts(r.api)).find((m) => m.run === id);
    if (waiting === undefined) throw new ApiError(404, "unknown_run", `run "${id}" does not exist in database "${r.api.name}"; GET ${API_PREFIX}runs lists the runs`);
    return { status: 200, body: { db: r.api.name, head: p.headSeq, run: { id, goal: waiting.goal, status: "submitted", submitted_at: waiting.submitted_at } } };
  },
};

const MAX_EVENTS = 5000;

const events: Route = {
  method: "GET",
  path: "/api/v1/runs/{id}/events",
  summary: "a run's events after seq `after` (at most `limit`)",
  async handle(r) {
    const id = r.params.id!;
    const after = intParam(r.query, "after", 0, Number.MAX_SAFE_INTEGER);
    const limit = intParam(r.query, "limit", 1000, MAX_EVENTS);
    if (limit === 0) throw new ApiError(400, "bad_query", `query parameter "limit" must be at least 1 (at most ${MAX_EVENTS}; default 1000)`);
    await knownRun(r.api, id);
    const out: LogEvent[] = [];
    let next = after;
    let ended = false;
    const reader = await r.api.storage.reader(r.api.name);
    try {
      // Pages of the log as `cairn log` reads them; stops once `limit` events of this run are in hand.
      for (let from = after; out.length < limit; ) {
        const raw = await reader.read(from, 2000);
        if (raw.length === 0) break;
        for (const e of raw) {
          if (out.length >= limit) break;
          next = e.seq;
          if (e.session !== id) continue;
          out.push(e);
          if (e.kind === "run_ended") ended = true;
        }
        from = raw[raw.length - 1]!.seq;
        if (raw.length < 2000) break;
      }
    } finally {
      await reader.close().catch(() => undefined);
    }
    return { status: 200, body: { run: id, events: out, next_after: next, ended } };
  },
};

const stream: Route = {
  method: "GET",
  path: "/api/v1/runs/{id}/events/stream",
  summary: "a run's events live (Server-Sent Events; resumes after Last-Event-ID or ?after=)",
  async handle(r) {
    const id = r.params.id!;
    const header = r.req.headers["last-event-id"];
    const lastId = typeof header === "string" && header.trim() !== "" ? header.trim() : null;
    if (lastId !== null && !/^\d{1,15}$/.test(lastId)) throw new ApiError(400, "bad_header", `Last-Event-ID must be the seq of the last event received (a whole number), got ${JSON.stringify(lastId.slice(0, 40))}`);
    const after = lastId !== null ? Number(lastId) : intParam(r.query, "after", 0, Number.MAX_SAFE_INTEGER);
    if (r.api.streams.size >= MAX_STREAMS) throw new ApiError(429, "too_many_streams", `${MAX_STREAMS} event streams are open on this server; close one, or page with GET ${API_PREFIX}runs/${id}/events?after=SEQ`, { "retry-after": "5" });
    await knownRun(r.api, id);
    const open = streamEvents(r, id, after);
    r.api.streams.add(open);
    await open.finally(() => r.api.streams.delete(open));
    return null;
  },
};

/** Writes the run's events after `after` as SSE (`id:` is the seq), then each new one, until the run ends, the client goes or the server closes. */
async function streamEvents(r: ApiRequest, id: string, after: number): Promise<void> {
  const { res, api } = r;
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store", connection: "keep-alive", "x-accel-buffering": "no" });
  // HEAD: the headers a GET would get, and no stream that would run until the client leaves.
  if (r.req.method === "HEAD") return void res.end();
  res.write("retry: 1000\n\n");
  const stop = new AbortController();
  const end = (): void => stop.abort();
  r.req.on("close", end);
  res.on("close", end);
  // A client gone mid-write: the stream ends here, never as an unhandled error of the process.
  res.on("error", end);
  api.closing.addEventListener("abort", end, { once: true });
  // A client that left (or a server that closed) while the run was looked up: its "close" already fired.
  if (r.req.socket.destroyed || res.destroyed || api.closing.aborted) end();
  const beat = setInterval(() => res.write(": keep-alive\n\n"), api.heartbeatMs);
  const reader = await api.storage.reader(api.name);
  try {
    const onBatch = (_events: readonly LogEvent[], raw: readonly LogEvent[]): void => {
      for (const e of raw) {
        if (e.session !== id) continue;
        res.write(`id: ${e.seq}\ndata: ${JSON.stringify(e)}\n\n`);
        if (e.kind === "run_ended") {
          res.write(`event: end\ndata: ${JSON.stringify({ run: id, seq: e.seq })}\n\n`);
          stop.abort();
          return;
        }
      }
    };
    const head = await readHistory(reader, after, onBatch);
    if (!stop.signal.aborted) await followHistory(reader, head, api.pollMs, stop.signal, onBatch);
  } catch (err) {
    api.logger.warn({ err, session: id }, "api: event stream ended by a storage error");
    if (!res.writableEnded) res.write(`event: error\ndata: ${JSON.stringify({ message: `reading the log failed: ${(err as Error).message}; reconnect with Last-Event-ID to resume` })}\n\n`);
  } finally {
    clearInterval(beat);
    api.closing.removeEventListener("abort", end);
    await reader.close().catch(() => undefined);
    if (!res.writableEnded) res.end();
  }
}

const observation: Route = {
  method: "POST",
  path: "/api/v1/runs/{id}/observations",
  summary: "post an observation to a run",
  async handle(r) {
    const run = r.params.id!;
    const b = parseBody(ObservationBody, r.body);
    const id = requestId(r, b.id);
    if (id === undefined) throw new ApiError(400, "bad_field", `an observation needs an id ("id" in the body or the Idempotency-Key header): posting the same id again is then harmless`);
    if (b.kind.startsWith("cairn.")) throw new ApiError(400, "bad_field", `field "kind": kinds starting with "cairn." are reserved for Cairn's own requests; choose another`);
    const tooBig = payloadProblem(b.payload);
    if (tooBig !== null) throw new ApiError(413, "too_large", tooBig);
    const obs = OutsideObservation.safeParse({ id, kind: b.kind, payload: b.payload });
    if (!obs.success) throw new ApiError(400, "bad_field", obs.error.issues.map((i) => `field "${i.path.join(".")}": ${i.message}`).join("; "));
    let outcome;
    try {
      ({ outcome } = await postObservation(r.api.storage, r.api.name, run, obs.data));
    } catch (err) {
      if (hasCode(err, "config")) throw new ApiError(409, "conflict", (err as Error).message);
      throw err;
    }
    r.api.logger.info({ session: run, observation: id, status: outcome.status }, "api: observation");
    switch (outcome.status) {
      case "unknown":
        throw new ApiError(404, "unknown_run", `${outcome.message} GET ${API_PREFIX}runs lists the runs`);
      case "refused":
        if (outcome.reason === "inbox_full") throw new ApiError(429, "inbox_full", outcome.message, { "retry-after": "5" });
        throw new ApiError(409, outcome.reason, outcome.message);
      case "duplicate":
        return { status: 200, body: { status: "duplicate", message: outcome.message, id } };
      case "posted":
      case "waiting_start":
        return { status: 202, body: { status: outcome.status, message: outcome.message, id } };
    }
  },
};

/** The event a steer request's application commits, by action: a retry finds it by its request id. */
const APPLIED_KIND = { pause: "run_paused", unpause: "run_unpaused", cancel: "run_cancel_requested", approve: "approval_decided", deny: "approval_decided" } as const;

/**
 * What the log already says of request `id` to run `session`: applied (its event), refused by the
 * owner, used for another request (a conflict), or nothing yet (null).
 */
async function earlierAnswer(api: ApiContext, session: string, id: string, request: SteerRequest): Promise<RequestOutcome | null> {
  let found: RequestOutcome | null = null;
  const reader = await api.storage.reader(api.name);
  try {
    await readHistory(reader, 0, (parsed) => {
      for (const e of parsed) {
        if (found !== null || e.session !== session) continue;
        if (e.kind === "post_refused" && e.body.id === id) found = { status: "refused", message: `the owner refused request ${id}: ${e.body.reason}`, request: id };
        const body = e.body as { request?: unknown; cell_id?: unknown; decision?: unknown };
        if (body.request !== id) continue;
        const same =
          e.kind === APPLIED_KIND[request.action] &&
          (e.kind !== "approval_decided" || (body.cell_id === (request as { cell_id: number }).cell_id && body.decision === (request.action === "approve" ? "approved" : "denied")));
        if (!same) throw new ApiError(409, "conflict", `the request id "${id}" was already used for another request (${e.kind} at seq ${e.seq}); use a new id`);
        found = { status: "applied", message: `request ${id} was applied before (seq ${e.seq}); nothing more to do`, request: id };
      }
    });
  } finally {
    await reader.close().catch(() => undefined);
  }
  return found;
}

/**
 * The answer to an operator's request: done 200, posted and not yet applied 202, refused 409. A
 * refusal carries the error shape of every other refusal too, so a client checks one field.
 */
function answer(o: RequestOutcome): { status: number; body: unknown } {
  const status = o.status === "applied" || o.status === "already" ? 200 : o.status === "refused" ? 409 : 202;
  return { status, body: o.status === "refused" ? { ...o, error: { code: "refused", message: o.message } } : o };
}

function steerRoute(action: SteerRequest["action"], path: string, summary: string): Route {
  return {
    method: "POST",
    path,
    summary,
    async handle(r) {
      const session = r.params.id!;
      const b = parseBody(action === "pause" ? PauseBody : PlainBody, r.body) as z.infer<typeof PauseBody>;
      const id = requestId(r, b.id);
      let cell: number | undefined;
      if (action === "approve" || action === "deny") {
        const n = r.params.n!;
        if (!/^[1-9]\d{0,9}$/.test(n)) throw new ApiError(400, "bad_path", `the cell in the path must be a cell id (a positive whole number), got ${JSON.stringify(n.slice(0, 40))}; GET ${API_PREFIX}runs/${session} lists awaiting_approval`);
        cell = Number(n);
      }
      if (action === "deny" && (b.reason ?? "").trim() === "") throw new ApiError(400, "bad_field", `field "reason" is required to deny: the model is told why, so that it can act on it`);
      const request = SteerRequest.parse({ action, reason: b.reason ?? "", ...(action === "pause" ? { now: b.now ?? false } : {}), ...(cell !== undefined ? { cell_id: cell } : {}) });
      await knownRun(r.api, session);
      let outcome = id !== undefined ? await earlierAnswer(r.api, session, id, request) : null;
      if (outcome === null) {
        try {
          outcome = await steerRun(r.api.storage, r.api.name, session, request, { ...(id !== undefined ? { id } : {}), waitMs: Math.min(b.wait_seconds !== undefined ? b.wait_seconds * 1000 : r.api.waitMs, r.api.waitMs) });
        } catch (err) {
          if (hasCode(err, "config")) throw new ApiError(409, "conflict", (err as Error).message);
          throw err;
        }
      }
      r.api.logger.info({ session, action, request: outcome.request, status: outcome.status }, "api: steer");
      return answer(outcome);
    },
  };
}

/** A fork of a run after round `at_round` (as `cairn fork`): 200 once the copy is complete, 202 while it waits or is copied. */
const fork: Route = {
  method: "POST",
  path: "/api/v1/runs/{id}/fork",
  summary: "fork a run after a round into a new run",
  async handle(r) {
    const session = r.params.id!;
    const b = parseBody(ForkBody, r.body);
    const id = requestId(r, b.id);
    if ((await knownRun(r.api, session)) === "pending") throw new ApiError(409, "conflict", `run ${session} waits to be started and has no round to fork after yet; try again once it has run`);
    let outcome;
    try {
      outcome = await forkRun(r.api.storage, r.api.name, session, { atRound: b.at_round, ...(b.new_session !== undefined ? { newSession: b.new_session } : {}), ...(b.reason !== undefined ? { reason: b.reason } : {}) }, { ...(id !== undefined ? { id } : {}), waitMs: Math.min(b.wait_seconds !== undefined ? b.wait_seconds * 1000 : r.api.waitMs, r.api.waitMs) });
    } catch (err) {
      if (hasCode(err, "config")) throw new ApiError(400, "bad_field", (err as Error).message);
      throw err;
    }
    r.api.logger.info({ session, fork: outcome.session, request: outcome.request, status: outcome.status }, "api: fork");
    return answer(outcome);
  },
};

/** The route table: a new route is one more entry (or passed as ApiOptions.routes). */
export const ROUTES: readonly Route[] = [
  submit,
  listRuns,
  getRun,
  events,
  stream,
  observation,
  steerRoute("pause", "/api/v1/runs/{id}/pause", "pause a run"),
  steerRoute("unpause", "/api/v1/runs/{id}/unpause", "unpause a run"),
  steerRoute("cancel", "/api/v1/runs/{id}/cancel", "cancel a run"),
  steerRoute("approve", "/api/v1/runs/{id}/cells/{n}/approve", "approve a cell waiting for approval"),
  steerRoute("deny", "/api/v1/runs/{id}/cells/{n}/deny", "deny a cell waiting for approval (reason required)"),
  fork,
];

// ---- the handler --------------------------------------------------------------------------


/** Builds the API handler of database `name`, mounted on the observability server by `cairn serve`. */
export function createApiHandler(opts: ApiOptions): ApiHandler {
  const routes = [...ROUTES, ...(opts.routes ?? [])];
  const closing = new AbortController();
  const api: ApiContext = { storage: opts.storage, name: opts.name, logger: opts.logger, waitMs: opts.waitMs ?? 30_000, pollMs: opts.pollMs ?? 200, heartbeatMs: opts.heartbeatMs ?? 15_000, closing: closing.signal, streams: new Set() };

  const serve = async (req: IncomingMessage, res: ServerResponse, target: URL): Promise<void> => {
    const path = target.pathname.replace(/\/+$/, "") || "/";
    // Defence in depth beside the bearer token (which a browser never sends across origins unasked):
    // a page of another origin is refused even if it got a request through.
    const origin = req.headers.origin;
    if (origin !== undefined && !sameOrigin(origin, req)) {
      throw new ApiError(403, "cross_origin", `requests from pages of other origins (${JSON.stringify(origin.slice(0, 100))}) are refused; call the API from a program, not from a web page of another site`);
    }
    if (!opts.tokenInForce) {
      throw new ApiError(401, "token_required", "this server was started without a token, so its API is closed (a submitted run runs code): start cairn serve with --token-file FILE or CAIRN_UI_TOKEN, and send \"Authorization: Bearer TOKEN\"");
    }
    const hits = routes.map((r) => ({ r, params: match(r.path, path) })).filter((h) => h.params !== null);
    if (hits.length === 0) throw new ApiError(404, "unknown_route", `no route ${path}; the routes are ${listing(routes)} (docs/api.md)`);
    const hit = hits.find((h) => h.r.method === req.method) ?? (req.method === "HEAD" ? hits.find((h) => h.r.method === "GET") : undefined);
    if (hit === undefined) {
      const allow = [...new Set(hits.map((h) => h.r.method))].join(", ");
      throw new ApiError(405, "method_not_allowed", `${path} takes ${allow}, not ${req.method ?? "?"}`, { allow });
    }
    const keyHeader = req.headers["idempotency-key"];
    const body = hit.r.method === "POST" ? await readBody(req, opts.bodyTimeoutMs ?? BODY_TIMEOUT_MS) : {};
    const reply = await hit.r.handle({ req, res, params: hit.params!, query: target.searchParams, body, idempotencyKey: typeof keyHeader === "string" ? keyHeader : undefined, api });
    if (reply !== null) sendJson(res, reply.status, reply.body, reply.headers);
  };

  return {
    async handle(req, res) {
      const target = requestTarget(req);
      if (target === null || !(target.pathname === API_PREFIX.slice(0, -1) || target.pathname.startsWith(API_PREFIX))) return false;
      await serve(req, res, target).catch((err: unknown) => {
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (err instanceof ApiError) return sendApiError(res, err);
        if (hasCode(err, "not_found")) return sendApiError(res, new ApiError(503, "no_database", `database "${opts.name}" does not exist yet; retry once its worker created it`, { "retry-after": "5" }));
        // The stack stays in the server's log; the client gets one line, never a trace.
        opts.logger.error({ err, method: req.method, path: target.pathname }, "api: request failed");
        const retryable = typeof err === "object" && err !== null && (err as { retryable?: unknown }).retryable === true;
        const why = (err instanceof Error ? err.message : String(err)).split("\n")[0]!.slice(0, 300);
        sendApiError(res, new ApiError(retryable ? 503 : 500, "internal", `the request failed inside the server (${why}); it may not have been applied: retry it with the same id (Idempotency-Key or "id")`));
      });
      return true;
    },
    async close() {
      // Event streams end now, each with its last bytes sent, before the server drops connections; a
      // steer request still following the log ends with the storage.
      closing.abort();
      // Bounded: a stream still reading a long history (or a storage that hangs) never holds SIGTERM.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([Promise.allSettled([...api.streams]), new Promise((r) => (timer = setTimeout(r, 5_000)))]);
      clearTimeout(timer);
    },
  };
}

