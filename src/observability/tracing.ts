/**
 * OpenTelemetry traces of the runs a process drives, exported over OTLP/HTTP (JSON) with the official
 * SDK: a span per run, per round, per model call, per commit and per cell.
 *
 * Enabled only when the standard variables name a collector (`OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it
 * off). Otherwise {@link NO_TRACING} is used: no `@opentelemetry` module is loaded (the SDK is imported
 * lazily, in {@link startTracing}) and every hook is a call that does nothing.
 *
 * The tree: `run` (one per session this process drives; its parent is the process's own
 * `TRACEPARENT` when it has one, else its trace id derives from the run's identity, so every process
 * that drives the run adds to one trace) > `round N` (from the round's start until the next round begins or
 * the run ends, so the cells its patch set running belong to it) > `chat MODEL`, `commit`, `cell N`.
 * A commit before the first round (the run's creation) hangs from the run span. A cell's span is its
 * launch, from its gate's preparation to its recorded result; the cell gets it as `TRACEPARENT`, so
 * its own tools can join the trace.
 *
 * A trace never breaks a run: spans are batched and exported off the run's path; an exporter that
 * cannot reach its collector logs once and drops spans; shutdown waits at most the export timeout
 * and a second.
 * What goes into attributes: ids, kinds, counts, sizes, the goal, a cmd cell's argv, exit codes and
 * durations. Never a key, a token, a header or a cell's environment.
 */
import type { Context, Span, SpanStatusCode as SpanStatusCodes, Tracer, TextMapPropagator } from "@opentelemetry/api";
import type { IdGenerator } from "@opentelemetry/sdk-trace-base";
import { createHash } from "node:crypto";
import type { Logger } from "pino";
import type { LogEvent, NewEvent, TokenUsage } from "../state/events.js";
import { VERSION } from "../version.js";

/** A cell as its span describes it: a cmd cell's argv, a script cell's size and digest. */
export type TracedCell = { readonly id: number; readonly kind: "cmd"; readonly argv: readonly string[] } | { readonly id: number; readonly kind: "script"; readonly source: string };

/** What makes a run itself, from its `session_created`: its trace id derives from it. */
export interface RunIdentity {
  readonly goal: string;
  readonly created_at: string;
  /** The run's random effect seed (null for runs created before it existed). */
  readonly seed: string | null;
}

/** How a cell's process ended (the executor's outcome), as its span records it. */
export interface TracedOutcome {
  readonly result: string;
  readonly exit_code: number | null;
  readonly signal: string | null;
  readonly duration_ms: number | null;
  readonly output_bytes?: number;
}

/** One cell launch's span. */
export interface CellSpan {
  /** What the cell's environment gets: TRACEPARENT (and TRACESTATE when there is one); empty when not tracing. */
  readonly env: Readonly<Record<string, string>>;
  /** Records how the process ended (before `end`). */
  outcome(o: TracedOutcome): void;
  /**
   * Ends the span; a launch whose end was not seen here (it never ran, the harness stopped first, its
   * output could not be recorded) ends as `no_outcome`. Once; later calls do nothing.
   */
  end(): void;
}

/** One model call's span. */
export interface ModelCallSpan {
  /** The call answered; `usage` is what the provider reported (null: nothing). */
  end(usage: TokenUsage | null): void;
  /** The call failed with `err` (its `kind`/`code` becomes `error.type`, never its text). */
  fail(err: unknown): void;
}

/** The hooks the harness calls. Every method is cheap and throws nothing of its own (`commit` passes on the commit's failure). */
export interface Tracing {
  readonly enabled: boolean;
  /** Tells how to look up the runs of database `db` (called once per harness, at open). */
  database(db: string, lookup: (session: string) => RunIdentity | undefined): void;
  /** Wraps one commit of `events` to database `db`: a span from `send` until it resolves or fails. */
  commit<T extends readonly LogEvent[]>(db: string, events: readonly NewEvent[], send: () => Promise<T>): Promise<T>;
  /** Round `n` (`turn`) of a session begins; the previous round's span ends. The same turn again continues it. */
  round(db: string, session: string, turn: string, n: number): void;
  /** A model call begins (attempt `attempt` of the session's current round). */
  modelCall(db: string, session: string, model: string, attempt: number): ModelCallSpan;
  /** A cell launch begins. */
  cell(db: string, session: string, cell: TracedCell): CellSpan;
  /** Ends what is open and flushes, within the export timeout (plus a second). Never rejects. */
  shutdown(): Promise<void>;
}

const NO_CELL: CellSpan = { env: {}, outcome: () => undefined, end: () => undefined };
const NO_CALL: ModelCallSpan = { end: () => undefined, fail: () => undefined };

/** Tracing off: nothing is recorded, nothing is loaded. */
export const NO_TRACING: Tracing = {
  enabled: false,
  database: () => undefined,
  commit: (_db, _events, send) => send(),
  round: () => undefined,
  modelCall: () => NO_CALL,
  cell: () => NO_CELL,
  shutdown: () => Promise.resolve(),
};

/** True when `env` asks for traces (a collector named, the SDK not disabled). */
export function tracingWanted(env: NodeJS.ProcessEnv): boolean {
  const named = (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? "").trim() !== "" || (env.OTEL_EXPORTER_OTLP_ENDPOINT ?? "").trim() !== "";
  const disabled = (env.OTEL_SDK_DISABLED ?? "").trim().toLowerCase() === "true" || (env.OTEL_TRACES_EXPORTER ?? "").trim().toLowerCase() === "none";
  return named && !disabled;
}

/** The export timeout when neither OTEL_EXPORTER_OTLP_TRACES_TIMEOUT nor OTEL_EXPORTER_OTLP_TIMEOUT sets one (the SDK's is 10 s). */
const DEFAULT_EXPORT_TIMEOUT_MS = 5000;

/**
 * Ended runs whose span is kept, so that a late commit of theirs (a stopped cell's last output) stays
 * in their trace; older ones are forgotten, so a long-lived worker's memory does not grow with them.
 */
const KEEP_ENDED = 256;

/** The longest text kept in one attribute (a goal, one argv element). */
const MAX_TEXT = 4096;
const MAX_ARGV = 256;

/**
 * Starts tracing as `env` asks, or returns {@link NO_TRACING} without loading anything. The SDK reads
 * its own variables (endpoints, headers, timeouts, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
 * OTEL_BSP_*) from the process's environment. Export failures are logged once through `logger`.
 */
export async function startTracing(env: NodeJS.ProcessEnv, logger: Logger): Promise<Tracing> {
  if (!tracingWanted(env)) return NO_TRACING;
  try {
    checkEndpoint(env);
    return await setUp(env, logger);
  } catch (err) {
    // A bad variable (an endpoint that is not a URL) costs the traces, never the run.
    logger.warn({ err: err instanceof Error ? err.message : String(err) }, "tracing: could not start; the run goes on without traces");
    return NO_TRACING;
  }
}

async function setUp(env: NodeJS.ProcessEnv, logger: Logger): Promise<Tracing> {
  const [api, sdk, exporterLib, resources, core, semconv] = await Promise.all([
    import("@opentelemetry/api"),
    import("@opentelemetry/sdk-trace-base"),
    import("@opentelemetry/exporter-trace-otlp-http"),
    import("@opentelemetry/resources"),
    import("@opentelemetry/core"),
    import("@opentelemetry/semantic-conventions"),
  ]);
  // The SDK reads a valid timeout variable itself; without one, ours (shorter than its 10 s).
  const fromEnv = envTimeoutMs(env);
  const timeoutMs = fromEnv ?? DEFAULT_EXPORT_TIMEOUT_MS;
  const exporter = new exporterLib.OTLPTraceExporter(fromEnv === null ? { timeoutMillis: timeoutMs } : {});
  // service.name "cairn" unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say otherwise.
  const resource = new resources.Resource({ [semconv.ATTR_SERVICE_NAME]: "cairn", [semconv.ATTR_SERVICE_VERSION]: VERSION }).merge(resources.envDetectorSync.detect());
  const ids = new DurableIds(new sdk.RandomIdGenerator());
  const provider = new sdk.BasicTracerProvider({ resource, idGenerator: ids, spanProcessors: [new sdk.BatchSpanProcessor(exporter)] });
  let failures = 0;
  const failed = (err: unknown) => {
    failures++;
    if (failures === 1) logger.warn({ err: err instanceof Error ? err.message : String(err) }, "tracing: spans could not be exported to the OTLP collector; they are dropped while it does not answer (said once)");
  };
  // The SDK reports a failed export of its batching timer here; the last flush fails in shutdown.
  core.setGlobalErrorHandler(failed);
  const propagator = new core.W3CTraceContextPropagator();
  // A process started inside a trace (its own TRACEPARENT) puts its runs in that trace.
  const carrier: Record<string, string> = {};
  if (env.TRACEPARENT !== undefined) carrier.traceparent = env.TRACEPARENT;
  if (env.TRACESTATE !== undefined) carrier.tracestate = env.TRACESTATE;
  const parent = propagator.extract(api.ROOT_CONTEXT, carrier, api.defaultTextMapGetter);
  const tracer = provider.getTracer("cairn", VERSION);
  return new OtelTracing(api, tracer, ids, propagator, parent, semconv.ATTR_ERROR_TYPE, async () => {
    const flushed = await bounded(provider.shutdown(), timeoutMs + 1000);
    if (flushed !== null) failed(flushed);
    if (failures > 1) logger.warn({ failures }, "tracing: span exports failed; those spans were dropped");
  });
}

/**
 * Throws when the endpoint that will be used is not an http(s) URL: the SDK would fall back to
 * localhost:4318 without a word, which may be some other collector.
 */
function checkEndpoint(env: NodeJS.ProcessEnv): void {
  const specific = (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? "").trim();
  const [name, value] = specific !== "" ? ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", specific] : ["OTEL_EXPORTER_OTLP_ENDPOINT", (env.OTEL_EXPORTER_OTLP_ENDPOINT ?? "").trim()];
  let url: URL | null = null;
  try {
    url = new URL(value);
  } catch {
    url = null;
  }
  if (url === null || (url.protocol !== "http:" && url.protocol !== "https:")) throw new Error(`${name} is "${value}", not an http(s) URL such as http://collector:4318`);
}

/** The export timeout the variables set (traces-specific first), in ms; null when none sets a valid one. */
function envTimeoutMs(env: NodeJS.ProcessEnv): number | null {
  for (const v of [env.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, env.OTEL_EXPORTER_OTLP_TIMEOUT]) {
    const n = Number(v);
    if (v !== undefined && v.trim() !== "" && Number.isFinite(n) && n > 0) return n;
  }
  return null;
}

/**
 * Waits for `p` at most `ms`: null when it resolved, else why not (its error, or the time it took).
 * Never rejects, never keeps the process alive.
 */
function bounded(p: Promise<unknown>, ms: number): Promise<unknown> {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(new Error(`the collector did not take the last spans within ${ms} ms`)), ms);
    t.unref();
    p.then(
      () => resolve(null),
      (err: unknown) => resolve(err ?? new Error("the last spans could not be exported")),
    ).finally(() => clearTimeout(t));
  });
}

type Api = typeof import("@opentelemetry/api");

/**
 * The SDK's random ids, except a root run span's trace id, which `next` sets just before that span
 * is started (startSpan asks for it synchronously, once).
 */
class DurableIds implements IdGenerator {
  next: string | null = null;
  constructor(private readonly random: IdGenerator) {}
  generateTraceId(): string {
    const id = this.next ?? this.random.generateTraceId();
    this.next = null;
    return id;
  }
  generateSpanId(): string {
    return this.random.generateSpanId();
  }
}

/**
 * A run's trace id: the same in every process that drives it (after a crash, a failover, a resume),
 * so its trace is one. A one-way hash of what makes it unique (its random seed included), so it
 * reveals nothing of the seed.
 */
export function runTraceId(db: string, session: string, run: RunIdentity): string {
  const id = createHash("sha256").update(`cairn.trace\u0000${db}\u0000${session}\u0000${run.created_at}\u0000${run.seed ?? ""}`).digest("hex").slice(0, 32);
  return /^0+$/.test(id) ? "1".padStart(32, "0") : id;
}

/** The spans of one run in this process. */
interface RunSpans {
  readonly run: Span;
  round: { readonly turn: string; readonly span: Span } | null;
  ended: boolean;
}

const text = (s: string): string => (s.length > MAX_TEXT ? `${s.slice(0, MAX_TEXT)}…` : s);

class OtelTracing implements Tracing {
  readonly enabled = true;
  private readonly runs = new Map<string, RunSpans>();
  private readonly lookups = new Map<string, (session: string) => RunIdentity | undefined>();
  /** The process was started inside a trace (TRACEPARENT): its runs join that trace instead. */
  private readonly inherited: boolean;
  /** Keys of ended runs still in `runs`, oldest first. */
  private readonly ended = new Set<string>();
  private readonly OK: SpanStatusCodes;
  private readonly ERROR: SpanStatusCodes;

  constructor(
    private readonly api: Api,
    private readonly tracer: Tracer,
    private readonly ids: DurableIds,
    private readonly propagator: TextMapPropagator,
    private readonly parent: Context,
    private readonly errorType: string,
    private readonly flush: () => Promise<void>,
  ) {
    this.OK = api.SpanStatusCode.OK;
    this.ERROR = api.SpanStatusCode.ERROR;
    const outer = api.trace.getSpanContext(parent);
    this.inherited = outer !== undefined && api.isSpanContextValid(outer);
  }

  database(db: string, lookup: (session: string) => RunIdentity | undefined): void {
    this.lookups.set(db, lookup);
  }

  /** The spans of run `session` of `db`, its run span started on first use (`known`: from the commit creating it). */
  private runOf(db: string, session: string, known?: RunIdentity): RunSpans {
    const key = `${db}\u0000${session}`;
    let r = this.runs.get(key);
    if (r === undefined) {
      const id = known ?? this.lookups.get(db)?.(session);
      if (id !== undefined && !this.inherited) this.ids.next = runTraceId(db, session, id);
      const run = this.tracer.startSpan("run", { attributes: { "cairn.db": db, "cairn.session": session } }, this.parent);
      this.ids.next = null;
      r = { run, round: null, ended: false };
      if (id !== undefined) this.setGoal(r, id.goal);
      this.runs.set(key, r);
    }
    return r;
  }

  /** The context new spans of `r` hang from: its open round, else the run. */
  private under(r: RunSpans): Context {
    return this.api.trace.setSpan(this.api.ROOT_CONTEXT, r.round?.span ?? r.run);
  }

  async commit<T extends readonly LogEvent[]>(db: string, events: readonly NewEvent[], send: () => Promise<T>): Promise<T> {
    const first = events[0];
    if (first === undefined) return send();
    const created = events.find((e) => e.kind === "session_created" && e.session === first.session);
    const body = created?.body as { goal: string; effect_seed?: string } | undefined;
    const r = this.runOf(db, first.session, created === undefined ? undefined : { goal: body!.goal, created_at: created.at, seed: body!.effect_seed ?? null });
    const kinds = [...new Set(events.map((e) => e.kind))];
    const span = this.tracer.startSpan(
      "commit",
      { attributes: { "cairn.commit.events": events.length, "cairn.commit.bytes": Buffer.byteLength(JSON.stringify(events)), "cairn.commit.kinds": kinds } },
      this.under(r),
    );
    let logged: T;
    try {
      logged = await send();
    } catch (err) {
      span.setAttribute(this.errorType, errorType(err));
      span.setStatus({ code: this.ERROR });
      span.end();
      throw err;
    }
    if (logged.length > 0) span.setAttributes({ "cairn.commit.first_seq": logged[0]!.seq, "cairn.commit.last_seq": logged[logged.length - 1]!.seq });
    span.end();
    for (const e of events) {
      if (e.kind !== "run_ended") continue;
      const body = e.body as { result: string; reason: string };
      this.endRun(this.runOf(db, e.session), body.result, body.reason);
      this.forgetOld(`${db}\u0000${e.session}`);
    }
    return logged;
  }

  private forgetOld(key: string): void {
    this.ended.delete(key);
    this.ended.add(key);
    for (const old of this.ended) {
      if (this.ended.size <= KEEP_ENDED) break;
      this.ended.delete(old);
      this.runs.delete(old);
    }
  }

  private setGoal(r: RunSpans, goal: string): void {
    r.run.setAttribute("cairn.goal", text(goal));
  }

  private endRound(r: RunSpans): void {
    r.round?.span.end();
    r.round = null;
  }

  private endRun(r: RunSpans, result: string | null, reason: string | null): void {
    if (r.ended) return;
    this.endRound(r);
    if (result !== null) {
      r.run.setAttributes({ "cairn.run.result": result, "cairn.run.reason": text(reason ?? "") });
      r.run.setStatus({ code: result === "success" ? this.OK : this.ERROR });
    } else r.run.setAttribute("cairn.run.result", "not_ended");
    r.run.end();
    r.ended = true;
  }

  round(db: string, session: string, turn: string, n: number): void {
    const r = this.runOf(db, session);
    if (r.round?.turn === turn) return;
    this.endRound(r);
    const span = this.tracer.startSpan(`round ${n}`, { attributes: { "cairn.session": session, "cairn.round.turn": turn, "cairn.round.n": n } }, this.api.trace.setSpan(this.api.ROOT_CONTEXT, r.run));
    r.round = { turn, span };
  }

  modelCall(db: string, session: string, model: string, attempt: number): ModelCallSpan {
    const r = this.runOf(db, session);
    // "anthropic/claude-…" and "openai/gpt-…" name provider and model; "scripted:FILE" is Cairn's replay.
    const slash = model.indexOf("/");
    const provider = model.startsWith("scripted:") ? "cairn.scripted" : slash > 0 ? model.slice(0, slash) : model;
    const requested = model.startsWith("scripted:") ? "scripted" : slash > 0 ? model.slice(slash + 1) : model;
    const span = this.tracer.startSpan(
      `chat ${requested}`,
      {
        kind: this.api.SpanKind.CLIENT,
        attributes: { "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": requested, "cairn.model.attempt": attempt },
      },
      this.under(r),
    );
    let done = false;
    return {
      end: (usage) => {
        if (done) return;
        done = true;
        if (usage !== null) span.setAttributes({ "gen_ai.usage.input_tokens": usage.input_tokens, "gen_ai.usage.output_tokens": usage.output_tokens });
        span.end();
      },
      fail: (err) => {
        if (done) return;
        done = true;
        const usage = (err as { usage?: TokenUsage | null } | null)?.usage;
        if (usage) span.setAttributes({ "gen_ai.usage.input_tokens": usage.input_tokens, "gen_ai.usage.output_tokens": usage.output_tokens });
        span.setAttribute(this.errorType, errorType(err));
        span.setStatus({ code: this.ERROR });
        span.end();
      },
    };
  }

  cell(db: string, session: string, cell: TracedCell): CellSpan {
    const r = this.runOf(db, session);
    const attributes: Record<string, string | number | string[]> = { "cairn.session": session, "cairn.cell.id": cell.id, "cairn.cell.kind": cell.kind };
    if (cell.kind === "cmd") attributes["process.command_args"] = cell.argv.slice(0, MAX_ARGV).map(text);
    else {
      // A script has no name: its size and digest identify it (the source itself is not sent).
      attributes["cairn.cell.script.bytes"] = Buffer.byteLength(cell.source);
      attributes["cairn.cell.script.sha256"] = createHash("sha256").update(cell.source).digest("hex");
    }
    const span = this.tracer.startSpan(`cell ${cell.id}`, { attributes }, this.under(r));
    const carrier: Record<string, string> = {};
    this.propagator.inject(this.api.trace.setSpan(this.api.ROOT_CONTEXT, span), carrier, this.api.defaultTextMapSetter);
    const env: Record<string, string> = {};
    if (carrier.traceparent !== undefined) env.TRACEPARENT = carrier.traceparent;
    if (carrier.tracestate !== undefined && carrier.tracestate !== "") env.TRACESTATE = carrier.tracestate;
    let recorded = false;
    let ended = false;
    return {
      env,
      outcome: (o) => {
        if (ended) return;
        recorded = true;
        span.setAttribute("cairn.cell.result", o.result);
        if (o.exit_code !== null) span.setAttribute("process.exit.code", o.exit_code);
        if (o.signal !== null) span.setAttribute("cairn.cell.signal", o.signal);
        if (o.duration_ms !== null) span.setAttribute("cairn.cell.duration_ms", o.duration_ms);
        if (o.output_bytes !== undefined) span.setAttribute("cairn.cell.output_bytes", o.output_bytes);
        span.setStatus({ code: o.result === "success" ? this.OK : this.ERROR });
      },
      end: () => {
        if (ended) return;
        ended = true;
        if (!recorded) span.setAttribute("cairn.cell.result", "no_outcome");
        span.end();
      },
    };
  }

  async shutdown(): Promise<void> {
    for (const r of this.runs.values()) this.endRun(r, null, null);
    await this.flush();
  }
}

/** A failure's stable name for `error.type`: its `code` (and model error `kind`), else its class; never its message. */
function errorType(err: unknown): string {
  if (err === null || typeof err !== "object") return "_OTHER";
  const e = err as { code?: unknown; kind?: unknown; name?: unknown };
  if (typeof e.code === "string") return typeof e.kind === "string" ? `${e.code}.${e.kind}` : e.code;
  return typeof e.name === "string" ? e.name : "_OTHER";
}
