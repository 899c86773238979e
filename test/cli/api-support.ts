/**
 * What the HTTP API tests share: a real `cairn serve` child process (from source), a JSON client for
 * its /api/v1 routes, and a Server-Sent Events reader over fetch.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { ENTRY, ROOT } from "./support.js";
import assert from "node:assert/strict";
import { sleep, until, untilQuiet } from "../support/wait.js";

/** The token the tests' servers run with (CAIRN_UI_TOKEN). */
export const TOKEN = "api-test-token-0123456789";

export interface Serve {
  readonly child: ChildProcess;
  readonly url: string;
  stderr(): string;
  /** Resolves with the exit code (null when killed by a signal) and the signal. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const started: ChildProcess[] = [];

/** SIGKILLs every serve still running (for `after`). */
export function killAll(): void {
  for (const c of started) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
}

/** A port free now (the kernel's choice), for a server that must be known before it owns anything. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as AddressInfo).port;
  await new Promise((r) => srv.close(r));
  return port;
}

/**
 * Starts `cairn serve ARGS` on a free loopback port and resolves once it owns the database
 * (`owner`), or once it answers /healthz (a standby).
 */
export async function startServe(args: string[], env: NodeJS.ProcessEnv = {}, owner = true): Promise<Serve> {
  const base: NodeJS.ProcessEnv = { ...process.env };
  delete base.CAIRN_CHAOS_KILL_AT;
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(process.execPath, ["--import", "tsx", ENTRY, "serve", ...args, "--listen", `127.0.0.1:${port}`, "--log-level", "warn"], { cwd: ROOT, env: { ...base, CAIRN_UI_TOKEN: TOKEN, ...env }, stdio: ["ignore", "ignore", "pipe"] });
  started.push(child);
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on("close", (code, signal) => resolve({ code, signal })));
  await untilQuiet(
    owner ? "serve to own the database" : "serve to listen",
    async () => {
      if (child.exitCode !== null) throw new Error(`serve exited ${child.exitCode}: ${stderr}`);
      if (owner) return /cairn: serving database/.test(stderr);
      return (await fetch(`${url}/healthz`)).status === 200;
    },
    180_000,
  );
  return { child, url, stderr: () => stderr, exited };
}

export interface Reply {
  readonly status: number;
  readonly headers: Headers;
  readonly json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

/** An API call: `body` is sent as JSON (a string is sent as is). */
export async function call(url: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  const h: Record<string, string> = { authorization: `Bearer ${TOKEN}`, ...headers };
  let data: string | undefined;
  if (body !== undefined) {
    data = typeof body === "string" ? body : JSON.stringify(body);
    h["content-type"] ??= "application/json";
  }
  const r = await fetch(`${url}${path}`, { method, headers: h, ...(data !== undefined ? { body: data } : {}) });
  const text = await r.text();
  let json: unknown = text;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON: kept as text for the assertion message
  }
  return { status: r.status, headers: r.headers, json };
}

/** One Server-Sent Event. */
export interface Sse {
  readonly id: string | null;
  readonly event: string;
  readonly data: string;
}

/** Reads an event stream until it ends (or `close()`); `events` fills as they arrive. */
export function readSse(url: string, headers: Record<string, string> = {}): { events: Sse[]; status: Promise<number>; done: Promise<void>; close(): void } {
  const events: Sse[] = [];
  const abort = new AbortController();
  let setStatus: (n: number) => void = () => {};
  const status = new Promise<number>((r) => (setStatus = r));
  const done = (async () => {
    try {
      const r = await fetch(url, { headers: { authorization: `Bearer ${TOKEN}`, ...headers }, signal: abort.signal });
      setStatus(r.status);
      const decoder = new TextDecoder();
      let buf = "";
      for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>) {
        buf += decoder.decode(chunk, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let id: string | null = null;
          let event = "message";
          const data: string[] = [];
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const [k, ...rest] = line.split(":");
            const v = rest.join(":").replace(/^ /, "");
            if (k === "id") id = v;
            else if (k === "event") event = v;
            else if (k === "data") data.push(v);
          }
          if (data.length > 0) events.push({ id, event, data: data.join("\n") });
        }
      }
    } catch (err) {
      if ((err as Error).name !== "AbortError") throw err;
    }
  })();
  return { events, status, done, close: () => abort.abort() };
}

/** A scripted model file: round i is `rounds[i]`. */
export function writeModel(file: string, rounds: unknown[][]): string {
  writeFileSync(file, JSON.stringify({ rounds: rounds.map((patch) => ({ patch })) }));
  return file;
}

export const cmdRound = (revision: number, id: number, argv: string[]): unknown[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv } },
];
export const concludeRound = (revision: number, id: number, text: string): unknown[] => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "conclusion", result: "success", text } },
];

/** A cell that appends a line to effect.txt, then runs until the file `release` exists. */
export const GATED = ["sh", "-c", "echo ran >> effect.txt; while [ ! -e release ]; do sleep 0.1; done"];

/** Run `id` as GET /api/v1/runs/{id} shows it. */
export const runOf = async (s: Serve, id: string) => (await call(s.url, "GET", `/api/v1/runs/${id}`)).json.run;

/** Every event of run `id`, through the events route (all pages). */
export async function eventsOf(s: Serve, id: string): Promise<{ seq: number; kind: string; body: Record<string, unknown> }[]> {
  const out: { seq: number; kind: string; body: Record<string, unknown> }[] = [];
  for (let after = 0; ; ) {
    const r = await call(s.url, "GET", `/api/v1/runs/${id}/events?after=${after}&limit=5000`);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    out.push(...r.json.events);
    if (r.json.next_after === after) return out;
    after = r.json.next_after;
  }
}

/**
 * Two ways a serve dies with an API request pending, on the adapter of `flags(role, extra)` (a
 * serve's flags; `role` names its own data dir where the adapter gives each process one):
 *
 * 1. The owner SIGKILLs itself right after committing a pause (CAIRN_CHAOS_KILL_AT=steer:committed):
 *    the client's request drops unanswered; its retry (same Idempotency-Key) on the standby that took
 *    over answers "applied before", and the log holds the pause once.
 * 2. An unpause sent to a standby while the owner is frozen (SIGSTOP), then SIGKILLed: the standby
 *    takes over and applies it; the pending request answers applied, or 202 when its wait ran out
 *    (never a false "done"); the log holds it once, and a retry adds nothing.
 */
export async function pendingRequestSurvivesKill(flags: (role: string, extra?: string[]) => string[], effect: () => number, diagnostic: (line: string) => void): Promise<void> {
    // A kills itself right after it commits a steer request: the API client's request is pending then.
    const a = await startServe(flags("a", ["--create", "--lease", "2s"]), { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    const b = await startServe(flags("b", ["--lease", "2s"]), {}, false);
    await until("b to wait in standby", () => /standby/.test(b.stderr()));
    const sub = await call(a.url, "POST", "/api/v1/runs", { goal: "stay running", session: "k1" });
    assert.equal(sub.status, 201, JSON.stringify(sub.json));
    await until("cell 1 to run", async () => ((await runOf(a, "k1")).executions?.[0]?.phase === "started" && effect() === 1 ? true : undefined));

    // 1. The owner dies with the request pending: the client sees no answer.
    const pending = await call(a.url, "POST", "/api/v1/runs/k1/pause", { reason: "hold" }, { "idempotency-key": "kill-pause-1" }).then(
      (r) => ({ answered: r.status }),
      (err: Error) => ({ dropped: err.message }),
    );
    assert.ok("dropped" in pending, `the owner died before answering: ${JSON.stringify(pending)}`);
    assert.equal((await a.exited).signal, "SIGKILL");
    await until("the standby to take over", async () => ((await fetch(`${b.url}/readyz`)).status === 200 ? true : undefined), 180_000);
    // The client retries the same request on the new owner: applied before, not again.
    const retry = await call(b.url, "POST", "/api/v1/runs/k1/pause", { reason: "hold" }, { "idempotency-key": "kill-pause-1" });
    assert.equal(retry.status, 200, JSON.stringify(retry.json));
    assert.equal(retry.json.status, "applied");
    assert.match(retry.json.message, /applied before/);
    assert.equal((await runOf(b, "k1")).status, "paused", "the pause holds across the failover");
    let log = await eventsOf(b, "k1");
    assert.equal(log.filter((e) => e.kind === "run_paused" && e.body.request === "kill-pause-1").length, 1, "the pause is in the log once");

    // 2. A request sent to a standby while the owner is frozen, then the owner SIGKILLed: it waits in
    // the mailbox; the standby takes over and applies it once.
    const d = await startServe(flags("d", ["--lease", "2s"]), {}, false);
    await until("d to wait in standby", () => /standby/.test(d.stderr()));
    b.child.kill("SIGSTOP");
    const answer = call(d.url, "POST", "/api/v1/runs/k1/unpause", { reason: "go on" }, { "idempotency-key": "kill-unpause-1" });
    // Either order of post and kill is correct (posted to a frozen owner, or to none): give it a moment.
    await sleep(500);
    b.child.kill("SIGKILL");
    assert.equal((await b.exited).signal, "SIGKILL");
    const got = await answer;
    diagnostic(`the pending unpause answered ${got.status} ${JSON.stringify(got.json)}`);
    assert.ok(got.status === 200 || got.status === 202, JSON.stringify(got.json));
    assert.ok(got.status === 200 ? got.json.status === "applied" : ["unconfirmed", "waiting"].includes(got.json.status), `an honest answer: ${JSON.stringify(got.json)}`);
    await until("the standby to take over and apply the unpause", async () => ((await runOf(d, "k1")).paused === null ? true : undefined), 180_000);
    log = await eventsOf(d, "k1");
    assert.equal(log.filter((e) => e.kind === "run_unpaused" && e.body.request === "kill-unpause-1").length, 1, "the unpause is in the log once");
    const again = await call(d.url, "POST", "/api/v1/runs/k1/unpause", { reason: "go on" }, { "idempotency-key": "kill-unpause-1" });
    assert.equal(again.status, 200);
    assert.match(again.json.message, /applied before/);
    assert.equal((await eventsOf(d, "k1")).filter((e) => e.kind === "run_unpaused").length, 1, "the retry added nothing");
    d.child.kill("SIGTERM");
    assert.equal((await d.exited).code, 0);
}
