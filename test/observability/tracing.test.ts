/**
 * OpenTelemetry traces of a real `cairn run` (a child process, a scripted model, real cells), read by
 * a real OTLP/HTTP receiver started here: the JSON the official exporter POSTs to /v1/traces is
 * decoded and the span tree checked (one trace; run > rounds > model call, commit, cell; tokens,
 * exit codes, durations; the TRACEPARENT a cell saw). A collector that refuses connections, or
 * accepts them and never answers, costs the run nothing; without the variables no @opentelemetry
 * module is loaded at all.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createServer as createHttpServer, type IncomingHttpHeaders, type Server } from "node:http";
import { createServer as createTcpServer, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cairn, ENTRY, ROOT } from "../cli/support.js";
import { cellEnvironment } from "../../src/exec/environment.js";
import { tracingWanted } from "../../src/observability/tracing.js";
import { tempDir } from "../harness/support.js";

const t = tempDir("cairn-tracing-");
after(() => t.cleanup());

const GOAL = "print the trace context, fail once, conclude";
const HEADER_SECRET = "hdr-secret-7f3a";
const KEY_SECRET = "sk-ant-never-in-a-span-91c2";
const SCRIPT = '# /// script\n# requires-python = ">=3.8"\n# dependencies = []\n# ///\nprint("from a script")\n';

/**
 * The scripted rounds: a cell that prints $TRACEPARENT, then one that exits 3 (its round's first
 * model call fails, a lost response), then a script, then success.
 */
function script(): string {
  const cmd = (id: number, argv: string[]) => ({ op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv } });
  const rounds = [
    { patch: [{ op: "test", path: "/revision", value: 0 }, cmd(1, ["sh", "-c", 'echo "TP=$TRACEPARENT"'])] },
    { patch: [{ op: "test", path: "/revision", value: 1 }, cmd(2, ["sh", "-c", "exit 3"])], fail_first_attempt: true },
    { patch: [{ op: "test", path: "/revision", value: 2 }, { op: "add", path: "/cells/-", value: { id: 3, previous_id: null, kind: "script", source: SCRIPT } }] },
    {
      patch: [
        { op: "test", path: "/revision", value: 3 },
        { op: "add", path: "/cells/-", value: { id: 4, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" } },
      ],
    },
  ];
  const file = join(t.dir, "rounds.json");
  writeFileSync(file, JSON.stringify({ rounds }));
  return file;
}

/** This process's environment without any OTEL_* or trace-context variable of its own. */
function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("OTEL_") && k !== "TRACEPARENT" && k !== "TRACESTATE") env[k] = v;
  return { ...env, ...extra };
}

let dbs = 0;
function runArgs(): string[] {
  const cwd = join(t.dir, `work-${++dbs}`);
  mkdirSync(cwd, { recursive: true });
  return ["run", GOAL, "--db", `traced-${dbs}`, "--data-dir", join(t.dir, "data"), "--cwd", cwd, "--model", `scripted:${script()}`];
}

/** An OTLP/JSON attribute value, as a plain value. */
type AnyValue = { stringValue?: string; intValue?: string | number; doubleValue?: number; boolValue?: boolean; arrayValue?: { values?: AnyValue[] } };
function plain(v: AnyValue): unknown {
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.arrayValue !== undefined) return (v.arrayValue.values ?? []).map(plain);
  return undefined;
}

interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  start: bigint;
  end: bigint;
  attrs: Record<string, unknown>;
  status: number;
  resource: Record<string, unknown>;
}

/** A real OTLP/HTTP receiver on a free 127.0.0.1 port: records what POST /v1/traces brings. */
class Receiver {
  readonly spans: ReceivedSpan[] = [];
  readonly headers: IncomingHttpHeaders[] = [];
  readonly bodies: string[] = [];
  private server: Server | null = null;

  async start(): Promise<string> {
    this.server = createHttpServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        if (req.method !== "POST" || req.url !== "/v1/traces") {
          res.writeHead(404).end();
          return;
        }
        const body = Buffer.concat(chunks).toString("utf8");
        this.bodies.push(body);
        this.headers.push(req.headers);
        this.take(JSON.parse(body));
        res.writeHead(200, { "content-type": "application/json" }).end("{}");
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private take(doc: { resourceSpans?: { resource?: { attributes?: { key: string; value: AnyValue }[] }; scopeSpans?: { spans?: Record<string, unknown>[] }[] }[] }): void {
    for (const rs of doc.resourceSpans ?? []) {
      const resource = Object.fromEntries((rs.resource?.attributes ?? []).map((a) => [a.key, plain(a.value)]));
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          const attrs = Object.fromEntries(((s.attributes as { key: string; value: AnyValue }[]) ?? []).map((a) => [a.key, plain(a.value)]));
          this.spans.push({
            traceId: String(s.traceId),
            spanId: String(s.spanId),
            parentSpanId: String(s.parentSpanId ?? ""),
            name: String(s.name),
            kind: Number(s.kind),
            start: BigInt(String(s.startTimeUnixNano)),
            end: BigInt(String(s.endTimeUnixNano)),
            attrs,
            status: Number((s.status as { code?: number } | undefined)?.code ?? 0),
            resource,
          });
        }
      }
    }
  }

  close(): Promise<void> {
    return new Promise((resolve) => (this.server === null ? resolve() : this.server.close(() => resolve())));
  }
}

describe("a traced cairn run, read by a real OTLP/HTTP receiver", () => {
  const receiver = new Receiver();
  let result: Awaited<ReturnType<typeof cairn>>;
  const byId = new Map<string, ReceivedSpan>();
  const named = (re: RegExp) => receiver.spans.filter((s) => re.test(s.name));

  before(async () => {
    const url = await receiver.start();
    result = await cairn(runArgs(), {
      env: cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: url, OTEL_SERVICE_NAME: "cairn-under-test", OTEL_EXPORTER_OTLP_HEADERS: `x-collector-token=${HEADER_SECRET}`, ANTHROPIC_API_KEY: KEY_SECRET }),
      timeoutMs: 180_000,
    });
    for (const s of receiver.spans) byId.set(s.spanId, s);
  });
  after(() => receiver.close());

  it("the run succeeds and its spans reach the collector as OTLP/JSON, with the configured headers and service name", () => {
    assert.equal(result.code, 0, result.stderr + result.stdout);
    assert.ok(receiver.bodies.length > 0, "the collector received at least one export");
    for (const h of receiver.headers) {
      assert.match(String(h["content-type"]), /application\/json/);
      assert.equal(h["x-collector-token"], HEADER_SECRET);
    }
    for (const s of receiver.spans) assert.equal(s.resource["service.name"], "cairn-under-test");
  });

  it("is one trace: a run span at the root, rounds under it, model calls, commits and cells under those", () => {
    const traces = new Set(receiver.spans.map((s) => s.traceId));
    assert.equal(traces.size, 1, `one trace id, got ${[...traces].join(", ")}`);
    const runs = named(/^run$/);
    assert.equal(runs.length, 1);
    const run = runs[0]!;
    assert.equal(run.parentSpanId, "", "the run span is the root");
    assert.equal(run.attrs["cairn.goal"], GOAL);
    assert.equal(run.attrs["cairn.session"], "s1");
    assert.equal(run.attrs["cairn.run.result"], "success");
    const rounds = named(/^round \d+$/);
    assert.deepEqual(rounds.map((r) => r.attrs["cairn.round.n"]).sort(), [1, 2, 3, 4]);
    for (const r of rounds) assert.equal(r.parentSpanId, run.spanId, `${r.name} hangs from the run`);
    // Every other span hangs from a round, or (the run's creation) from the run itself; no orphans.
    for (const s of receiver.spans) {
      if (s === run) continue;
      assert.ok(byId.has(s.parentSpanId), `${s.name}'s parent ${s.parentSpanId} was exported`);
      if (!/^round /.test(s.name)) assert.ok(byId.get(s.parentSpanId) === run || /^round /.test(byId.get(s.parentSpanId)!.name), `${s.name} hangs from a round or the run`);
    }
  });

  it("each model call is a GenAI client span under its round, with input and output tokens; a failed call says why", () => {
    const all = named(/^chat /);
    assert.equal(all.length, 5);
    const failed = all.filter((c) => c.status === 2);
    assert.equal(failed.length, 1);
    assert.equal(failed[0]!.attrs["error.type"], "model.transport");
    assert.equal(byId.get(failed[0]!.parentSpanId)!.attrs["cairn.round.n"], 2);
    const calls = all.filter((c) => c.status !== 2);
    for (const c of calls) {
      assert.equal(c.kind, 3, "SpanKind CLIENT (3 in OTLP)");
      assert.equal(c.attrs["gen_ai.operation.name"], "chat");
      assert.equal(typeof c.attrs["gen_ai.provider.name"], "string");
      assert.ok((c.attrs["gen_ai.usage.input_tokens"] as number) > 0, "input tokens");
      assert.ok((c.attrs["gen_ai.usage.output_tokens"] as number) > 0, "output tokens");
      assert.match(byId.get(c.parentSpanId)!.name, /^round \d+$/);
    }
    assert.deepEqual(calls.map((c) => byId.get(c.parentSpanId)!.attrs["cairn.round.n"]).sort(), [1, 2, 3, 4], "one answered call per round");
  });

  it("each commit is a span with its event count and bytes; the run's creation hangs from the run", () => {
    const commits = named(/^commit$/);
    assert.ok(commits.length >= 6, `several commits, got ${commits.length}`);
    for (const c of commits) {
      assert.ok((c.attrs["cairn.commit.events"] as number) >= 1);
      assert.ok((c.attrs["cairn.commit.bytes"] as number) > 0);
      assert.ok((c.attrs["cairn.commit.last_seq"] as number) >= (c.attrs["cairn.commit.first_seq"] as number));
    }
    const creation = commits.find((c) => (c.attrs["cairn.commit.kinds"] as string[]).includes("session_created"));
    assert.ok(creation !== undefined);
    assert.equal(byId.get(creation.parentSpanId)!.name, "run");
    const end = commits.find((c) => (c.attrs["cairn.commit.kinds"] as string[]).includes("run_ended"));
    assert.ok(end !== undefined, "the run's end was committed inside the trace");
  });

  it("each cell is a span under the round that queued it, with argv, exit code and duration", () => {
    const cells = named(/^cell \d+$/);
    assert.deepEqual(cells.map((c) => c.name).sort(), ["cell 1", "cell 2", "cell 3"]);
    const one = cells.find((c) => c.name === "cell 1")!;
    const two = cells.find((c) => c.name === "cell 2")!;
    assert.deepEqual(one.attrs["process.command_args"], ["sh", "-c", 'echo "TP=$TRACEPARENT"']);
    assert.equal(one.attrs["process.exit.code"], 0);
    assert.equal(one.attrs["cairn.cell.result"], "success");
    assert.equal(two.attrs["process.exit.code"], 3);
    assert.equal(two.attrs["cairn.cell.result"], "error");
    assert.equal(two.status, 2, "status ERROR");
    for (const c of cells) {
      assert.equal(typeof c.attrs["cairn.cell.duration_ms"], "number");
      assert.ok(c.end >= c.start);
    }
    assert.equal(byId.get(one.parentSpanId)!.attrs["cairn.round.n"], 1);
    assert.equal(byId.get(two.parentSpanId)!.attrs["cairn.round.n"], 2);
    const script = cells.find((c) => c.name === "cell 3")!;
    assert.equal(script.attrs["cairn.cell.kind"], "script");
    assert.equal(script.attrs["cairn.cell.script.bytes"], Buffer.byteLength(SCRIPT));
    assert.equal(script.attrs["cairn.cell.script.sha256"], createHash("sha256").update(SCRIPT).digest("hex"));
    assert.equal(script.attrs["process.exit.code"], 0);
    assert.equal(script.attrs["process.command_args"], undefined, "a script's span carries no argv");
  });

  it("a cell sees TRACEPARENT naming the run's trace and its own span as parent", () => {
    // The progress shows the cell's argv (TP=$TRACEPARENT) and then its output (TP=00-...).
    const m = /TP=(00-\S*)/.exec(result.stdout);
    assert.ok(m !== null, `the cell's output is in the progress: ${result.stdout}`);
    const tp = /^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$/.exec(m[1]!);
    assert.ok(tp !== null, `a W3C traceparent, got "${m[1]}"`);
    const cell = named(/^cell 1$/)[0]!;
    assert.equal(tp[1], cell.traceId);
    assert.equal(tp[2], cell.spanId);
  });

  it("no secret reaches the collector: neither the model key nor the exporter's own header", () => {
    const all = receiver.bodies.join("\n");
    assert.ok(!all.includes(KEY_SECRET), "the model key is in no span");
    assert.ok(!all.includes(HEADER_SECRET), "the collector header is in no span");
    assert.ok(all.includes(GOAL), "the goal is (as documented)");
  });
});

describe("a cairn run started inside a trace (its own TRACEPARENT)", () => {
  const receiver = new Receiver();
  after(() => receiver.close());

  it("puts its run span in that trace, under that parent", async () => {
    const url = await receiver.start();
    const outer = { trace: "4bf92f3577b34da6a3ce929d0e0e4736", span: "00f067aa0ba902b7" };
    const r = await cairn(runArgs(), { env: cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: url, TRACEPARENT: `00-${outer.trace}-${outer.span}-01` }), timeoutMs: 180_000 });
    assert.equal(r.code, 0, r.stderr + r.stdout);
    const run = receiver.spans.find((s) => s.name === "run");
    assert.ok(run !== undefined);
    assert.equal(run.traceId, outer.trace);
    assert.equal(run.parentSpanId, outer.span);
    assert.deepEqual(new Set(receiver.spans.map((s) => s.traceId)), new Set([outer.trace]));
    // The cell's TRACEPARENT names its own span, not the one the harness was started with.
    const tp = /TP=(00-\S*)/.exec(r.stdout)?.[1];
    const cell = receiver.spans.find((s) => s.name === "cell 1");
    assert.equal(tp, `00-${outer.trace}-${cell?.spanId}-01`);
  });
});

describe("a run keeps one trace across the processes that drive it", () => {
  const receiver = new Receiver();
  after(() => receiver.close());

  it("stopped by SIGTERM while a cell runs, then resumed by another process: one trace, a run span from each", async () => {
    const url = await receiver.start();
    const file = join(t.dir, "resumed.json");
    const rounds = [
      { patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["sleep", "60"] } }] },
      { patch: [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "interrupted" } }] },
    ];
    writeFileSync(file, JSON.stringify({ rounds }));
    const cwd = join(t.dir, "resumed-work");
    mkdirSync(cwd, { recursive: true });
    const common = ["--db", "resumed", "--data-dir", join(t.dir, "data"), "--model", `scripted:${file}`];
    const env = cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: url });
    const first = spawn(process.execPath, ["--import", "tsx", ENTRY, "run", "sleep, then give up", ...common, "--cwd", cwd], { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    first.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    first.stderr.resume();
    const exited = new Promise<number | null>((resolve) => first.on("close", (code) => resolve(code)));
    const guard = setTimeout(() => first.kill("SIGKILL"), 180_000);
    try {
      for (let i = 0; i < 1200 && !/\[cell 1\] started/.test(stdout); i++) await new Promise((r) => setTimeout(r, 100));
      assert.match(stdout, /\[cell 1\] started/);
      first.kill("SIGTERM");
      assert.equal(await exited, 143, stdout);
    } finally {
      clearTimeout(guard);
      first.kill("SIGKILL");
    }
    const fromFirst = receiver.spans.length;
    assert.ok(fromFirst > 0, "the stopped process flushed its spans");
    const resumed = await cairn(["resume", ...common], { env, timeoutMs: 180_000 });
    assert.equal(resumed.code, 1, resumed.stderr + resumed.stdout);
    assert.ok(receiver.spans.length > fromFirst, "the resuming process exported its own spans");
    assert.deepEqual(new Set(receiver.spans.map((s) => s.traceId)).size, 1, "one trace for the run, across both processes");
    const runs = receiver.spans.filter((s) => s.name === "run");
    assert.deepEqual(runs.map((r) => r.attrs["cairn.run.result"]).sort(), ["failure", "not_ended"]);
    for (const r of runs) assert.equal(r.attrs["cairn.goal"], "sleep, then give up");
  });
});

describe("cairn serve traces the runs it drives", () => {
  const receiver = new Receiver();
  after(() => receiver.close());

  it("a run handed to a live worker is a trace from that worker, flushed when it stops on SIGTERM", async () => {
    const url = await receiver.start();
    const args = runArgs(); // ["run", GOAL, "--db", DB, "--data-dir", DATA, "--cwd", CWD, "--model", SPEC]
    const [db, data, cwd, model] = [args[3]!, args[5]!, args[7]!, args[9]!];
    const serve = spawn(process.execPath, ["--import", "tsx", ENTRY, "serve", "--db", db, "--data-dir", data, "--cwd", cwd, "--model", model, "--create", "--listen", "127.0.0.1:0"], {
      cwd: ROOT,
      env: cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: url }),
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    serve.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => serve.on("close", (code) => resolve(code)));
    const guard = setTimeout(() => serve.kill("SIGKILL"), 180_000);
    try {
      for (let i = 0; i < 1200 && !/serving database/.test(stderr); i++) await new Promise((r) => setTimeout(r, 100));
      assert.match(stderr, /serving database/);
      // Handed over through the mailbox and followed until it ends (this process traces nothing).
      const handed = await cairn(args, { env: cleanEnv({}), timeoutMs: 180_000 });
      assert.equal(handed.code, 0, handed.stderr + handed.stdout);
      assert.match(handed.stdout, /handed run/);
      serve.kill("SIGTERM");
      assert.equal(await exited, 0, stderr);
    } finally {
      clearTimeout(guard);
      serve.kill("SIGKILL");
    }
    const run = receiver.spans.filter((s) => s.name === "run");
    assert.equal(run.length, 1);
    assert.equal(run[0]!.attrs["cairn.run.result"], "success");
    assert.deepEqual(new Set(receiver.spans.map((s) => s.traceId)), new Set([run[0]!.traceId]));
    assert.equal(receiver.spans.filter((s) => /^chat /.test(s.name)).length, 5, "four rounds, one call failed and retried");
    assert.deepEqual(receiver.spans.filter((s) => /^cell /.test(s.name)).map((s) => s.attrs["process.exit.code"]).sort(), [0, 0, 3]);
  });
});

describe("a cell's trace context comes from its own span, never from the harness's environment", () => {
  const host = { PATH: "/bin", TRACEPARENT: "00-11111111111111111111111111111111-2222222222222222-01", TRACESTATE: "outer=1" };
  const mine = "00-33333333333333333333333333333333-4444444444444444-01";

  it("the harness's own TRACEPARENT and TRACESTATE are not passed on", () => {
    assert.deepEqual(cellEnvironment(host, [], { CAIRN_CELL: "1" }), { PATH: "/bin", CAIRN_CELL: "1" });
  });

  it("a traced cell gets its span's TRACEPARENT, and no TRACESTATE from elsewhere, even when the operator names them", () => {
    assert.deepEqual(cellEnvironment(host, ["TRACEPARENT", "TRACESTATE"], { TRACEPARENT: mine }), { PATH: "/bin", TRACEPARENT: mine });
    assert.deepEqual(cellEnvironment(host, [], { TRACEPARENT: mine, TRACESTATE: "cairn=1" }), { PATH: "/bin", TRACEPARENT: mine, TRACESTATE: "cairn=1" });
  });

  it("without tracing, a context the operator names (--cell-env TRACEPARENT) passes", () => {
    assert.deepEqual(cellEnvironment(host, ["TRACEPARENT"], {}), { PATH: "/bin", TRACEPARENT: host.TRACEPARENT });
  });
});

describe("which variables turn tracing on", () => {
  it("an endpoint (general or for traces) turns it on; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off; blanks are unset", () => {
    assert.equal(tracingWanted({}), false);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: "  " }), false);
    assert.equal(tracingWanted({ OTEL_SERVICE_NAME: "x", OTEL_EXPORTER_OTLP_HEADERS: "a=b" }), false);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318" }), true);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://c:4318/v1/traces" }), true);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "TRUE" }), false);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "false" }), true);
    assert.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "none" }), false);
  });
});

describe("a collector that is down never breaks a run", () => {
  let blackhole: { url: string; close(): Promise<void> } | null = null;
  after(() => blackhole?.close());

  it("refused connections: the run succeeds, and the failure is logged once however many exports fail", async () => {
    // A port that was free a moment ago: nothing listens on it.
    const probe = createTcpServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    // Exports every 20 ms: several fail during the run.
    const r = await cairn(runArgs(), { env: cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`, OTEL_BSP_SCHEDULE_DELAY: "20" }), timeoutMs: 180_000 });
    assert.equal(r.code, 0, r.stderr + r.stdout);
    assert.match(r.stdout, /run s1 succeeded/);
    assert.equal(r.stderr.split("spans could not be exported").length - 1, 1, `logged once: ${r.stderr}`);
    assert.match(r.stderr, /span exports failed; those spans were dropped/, "the count of failed exports is told at exit");
  });

  it("a collector that accepts connections and never answers: the run succeeds and the process exits on its own", async () => {
    const sockets = new Set<Socket>();
    const server = createTcpServer((s) => {
      sockets.add(s);
      s.on("error", () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    blackhole = {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      close: () =>
        new Promise<void>((resolve) => {
          for (const s of sockets) s.destroy();
          server.close(() => resolve());
        }),
    };
    // The hang guard (SIGKILL after 120 s) is not a timing assertion: a hanging exit shows as signal SIGKILL.
    const r = await cairn(runArgs(), { env: cleanEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: blackhole.url }), timeoutMs: 120_000 });
    assert.equal(r.signal, null, "the process exited by itself");
    assert.equal(r.code, 0, r.stderr + r.stdout);
    assert.match(r.stdout, /run s1 succeeded/);
    assert.ok(sockets.size > 0, "the exporter did reach the collector's port");
    assert.equal(r.stderr.split("spans could not be exported").length - 1, 1, `the lost spans are told once: ${r.stderr}`);
    assert.doesNotMatch(r.stderr, /resources were still open/, "no export left running: the exit backstop was not needed");
  });
});

describe("without the variables, tracing costs nothing", () => {
  /** The module URLs `cairn run` loaded (recorded by test/cli/trace, as the lazy-load test does). */
  function loadedBy(env: Record<string, string>): { modules: string[]; code: number | null; stderr: string } {
    const trace = join(t.dir, `modules-${++dbs}.txt`);
    rmSync(trace, { force: true });
    const r = spawnSync(process.execPath, ["--import", "tsx", "--import", join(ROOT, "test/cli/trace/register.mjs"), ENTRY, ...runArgs()], {
      cwd: ROOT,
      env: cleanEnv({ ...env, CAIRN_TRACE_MODULES: trace }),
      encoding: "utf8",
      timeout: 180_000,
    });
    return { modules: readFileSync(trace, "utf8").split("\n").filter((l) => l !== ""), code: r.status, stderr: r.stderr };
  }
  const otel = (modules: readonly string[]) => modules.filter((m) => m.includes("/node_modules/@opentelemetry/"));

  it("a run without OTEL_EXPORTER_OTLP_ENDPOINT loads no @opentelemetry module; with it, the SDK is loaded", () => {
    const plain = loadedBy({});
    assert.equal(plain.code, 0, plain.stderr);
    assert.ok(plain.modules.some((m) => m.includes("/src/harness/harness.")), "the recording saw the run's own modules");
    assert.deepEqual(otel(plain.modules), []);
    // The positive control: the same run, traced (to a port nobody listens on), loads the SDK.
    const traced = loadedBy({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9" });
    assert.equal(traced.code, 0, traced.stderr);
    assert.ok(otel(traced.modules).some((m) => m.includes("/sdk-trace-base/")), "the traced run loaded the SDK");
  });

  it("an endpoint that is not a URL is said once, and the run goes on untraced (never to a default collector)", () => {
    const r = loadedBy({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr.split("tracing: could not start").length - 1, 1, r.stderr);
    assert.match(r.stderr, /OTEL_EXPORTER_OTLP_ENDPOINT is \\"collector:4318\\", not an http\(s\) URL/);
    assert.deepEqual(otel(r.modules), []);
  });

  it("OTEL_SDK_DISABLED=true turns it off even with an endpoint", () => {
    const r = loadedBy({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9", OTEL_SDK_DISABLED: "true" });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(otel(r.modules), []);
  });
});
