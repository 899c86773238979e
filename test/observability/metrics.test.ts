import { test } from "node:test";
import assert from "node:assert/strict";
import { Registry } from "prom-client";
import { Metrics, REJECTION_CODES } from "../../src/observability/metrics.js";
import { VERSION } from "../../src/version.js";
import { parseExposition, valueOf, type Sample } from "./exposition.js";

async function scrape(m: Metrics): Promise<Sample[]> {
  return parseExposition(await m.registry.metrics());
}

/** Each case calls one method and names a series it must move, with the expected value after. */
interface Case {
  method: string;
  call: (m: Metrics) => void;
  series: string;
  labels?: Record<string, string>;
  expected: number;
}

const cases: Case[] = [
  { method: "commit ok (count)", call: (m) => m.commit("sqlite", "ok", 0.002, 3), series: "cairn_storage_commits_total", labels: { adapter: "sqlite", outcome: "ok" }, expected: 1 },
  { method: "commit ok (events)", call: (m) => m.commit("sqlite", "ok", 0.002, 3), series: "cairn_storage_committed_events_total", labels: { adapter: "sqlite" }, expected: 3 },
  { method: "commit ok (duration sum)", call: (m) => m.commit("sqlite", "ok", 0.25, 3), series: "cairn_storage_commit_duration_seconds_sum", labels: { adapter: "sqlite" }, expected: 0.25 },
  { method: "commit ok (duration bucket)", call: (m) => m.commit("sqlite", "ok", 0.0004, 3), series: "cairn_storage_commit_duration_seconds_bucket", labels: { adapter: "sqlite", le: "0.0005" }, expected: 1 },
  { method: "commit rejected adds no events", call: (m) => m.commit("replicated", "rejected", 0.01, 5), series: "cairn_storage_commits_total", labels: { adapter: "replicated", outcome: "rejected" }, expected: 1 },
  { method: "commit uncertain", call: (m) => m.commit("replicated", "uncertain", 1, 1), series: "cairn_storage_commits_total", labels: { adapter: "replicated", outcome: "uncertain" }, expected: 1 },
  { method: "commit fenced", call: (m) => m.commit("replicated", "fenced", 0.1, 1), series: "cairn_storage_commits_total", labels: { adapter: "replicated", outcome: "fenced" }, expected: 1 },
  ...(
    [
      ["cairn_storage_quorum_held", 1],
      ["cairn_storage_members_reachable", 2],
      ["cairn_storage_members_total", 3],
      ["cairn_storage_backlog_commits", 4],
      ["cairn_storage_backlog_bytes", 4096],
      ["cairn_storage_quorum_wait_seconds_total", 1.5],
      ["cairn_ownership_epoch", 7],
      ["cairn_storage_reachable", 1],
    ] as const
  ).map(([series, expected]): Case => ({
    method: `storageStats -> ${series}`,
    call: (m) => m.storageStats({ adapter: "replicated", epoch: 7, fenced: false, poisoned: false, membersReachable: 2, membersTotal: 3, quorumHeld: true, backlogCommits: 4, backlogBytes: 4096, quorumWaitSeconds: 1.5 }),
    series,
    labels: { adapter: "replicated" },
    expected,
  })),
  { method: "storageStats poisoned -> unreachable", call: (m) => m.storageStats({ adapter: "sqlite", epoch: 2, fenced: false, poisoned: true }), series: "cairn_storage_reachable", labels: { adapter: "sqlite" }, expected: 0 },
  { method: "storageStats quorum lost -> 0", call: (m) => m.storageStats({ adapter: "replicated", epoch: 2, fenced: false, poisoned: false, quorumHeld: false }), series: "cairn_storage_quorum_held", labels: { adapter: "replicated" }, expected: 0 },
  { method: "opened (count)", call: (m) => m.opened(), series: "cairn_ownership_opens_total", expected: 1 },
  { method: "opened (owner)", call: (m) => m.opened(), series: "cairn_owner", expected: 1 },
  { method: "resumed", call: (m) => m.resumed(), series: "cairn_resumes_total", expected: 1 },
  { method: "fenced (count)", call: (m) => { m.opened(); m.fenced(); }, series: "cairn_ownership_fenced_total", expected: 1 },
  { method: "executionFinished (count)", call: (m) => m.executionFinished("cmd", "error", 2), series: "cairn_executions_total", labels: { kind: "cmd", result: "error" }, expected: 1 },
  { method: "executionFinished (duration)", call: (m) => m.executionFinished("script", "success", 12.5), series: "cairn_execution_duration_seconds_sum", labels: { kind: "script" }, expected: 12.5 },
  { method: "executionFinished UnknownExecution", call: (m) => m.executionFinished("script", "UnknownExecution", null), series: "cairn_executions_total", labels: { kind: "script", result: "UnknownExecution" }, expected: 1 },
  { method: "dispatchLatency", call: (m) => m.dispatchLatency(0.03), series: "cairn_dispatch_latency_seconds_count", expected: 1 },
  { method: "setExecutions (queued)", call: (m) => m.setExecutions(5, 1), series: "cairn_executions_queued", expected: 5 },
  { method: "setExecutions (running)", call: (m) => m.setExecutions(5, 1), series: "cairn_executions_running", expected: 1 },
  { method: "unresolvedUnknown", call: (m) => m.unresolvedUnknown(2), series: "cairn_unknown_executions_unresolved", expected: 2 },
  { method: "modelRound (count)", call: (m) => m.modelRound(4), series: "cairn_model_rounds_total", expected: 1 },
  { method: "modelRound (duration)", call: (m) => m.modelRound(4), series: "cairn_model_round_duration_seconds_sum", expected: 4 },
  { method: "modelAttempt", call: (m) => m.modelAttempt("error"), series: "cairn_model_attempts_total", labels: { outcome: "error" }, expected: 1 },
  { method: "modelRetry", call: (m) => m.modelRetry(), series: "cairn_model_retries_total", expected: 1 },
  { method: "patchRejected", call: (m) => m.patchRejected("busy_cell"), series: "cairn_patches_rejected_total", labels: { code: "busy_cell" }, expected: 1 },
  { method: "patchRejected unknown code -> other", call: (m) => m.patchRejected("session-1234/cell-9"), series: "cairn_patches_rejected_total", labels: { code: "other" }, expected: 1 },
  { method: "tokens (input)", call: (m) => m.tokens(1200, 80), series: "cairn_model_tokens_total", labels: { direction: "input" }, expected: 1200 },
  { method: "tokens (output)", call: (m) => m.tokens(1200, 80), series: "cairn_model_tokens_total", labels: { direction: "output" }, expected: 80 },
  { method: "setInbox", call: (m) => m.setInbox(3), series: "cairn_inbox_depth", expected: 3 },
  { method: "setTimersPending", call: (m) => m.setTimersPending(6), series: "cairn_timers_pending", expected: 6 },
  { method: "timerFired", call: (m) => m.timerFired(0.2), series: "cairn_timer_lateness_seconds_sum", expected: 0.2 },
  { method: "runStarted", call: (m) => m.runStarted(), series: "cairn_runs_started_total", expected: 1 },
  { method: "runEnded", call: (m) => m.runEnded("failure"), series: "cairn_runs_ended_total", labels: { result: "failure" }, expected: 1 },
  { method: "setRunsActive", call: (m) => m.setRunsActive(2), series: "cairn_runs_active", expected: 2 },
  { method: "setRunsBlocked", call: (m) => m.setRunsBlocked(1), series: "cairn_runs_blocked", expected: 1 },
  { method: "runBlocked", call: (m) => m.runBlocked("auth"), series: "cairn_run_blocks_total", labels: { cause: "auth" }, expected: 1 },
  { method: "setRunsPaused", call: (m) => m.setRunsPaused(2), series: "cairn_runs_paused", expected: 2 },
  { method: "setApprovalsWaiting (count)", call: (m) => m.setApprovalsWaiting(3, 90), series: "cairn_approvals_waiting", expected: 3 },
  { method: "setApprovalsWaiting (oldest)", call: (m) => m.setApprovalsWaiting(3, 90), series: "cairn_approval_oldest_wait_seconds", expected: 90 },
  { method: "operatorRequest", call: (m) => m.operatorRequest("deny"), series: "cairn_operator_requests_total", labels: { action: "deny" }, expected: 1 },
  { method: "operatorRequest (fork)", call: (m) => m.operatorRequest("fork"), series: "cairn_operator_requests_total", labels: { action: "fork" }, expected: 1 },
  { method: "lastProgress", call: (m) => m.lastProgress(1_700_000_000), series: "cairn_last_progress_timestamp_seconds", expected: 1_700_000_000 },
];

for (const c of cases) {
  test(`${c.method} moves ${c.series}`, async () => {
    const m = new Metrics({ defaultMetrics: false });
    const before = valueOf(await scrape(m), c.series, c.labels);
    assert.notEqual(before, c.expected, "the series must not already hold the expected value");
    c.call(m);
    assert.equal(valueOf(await scrape(m), c.series, c.labels), c.expected);
  });
}

test("a rejected commit counts no committed events", async () => {
  const m = new Metrics({ defaultMetrics: false });
  m.commit("sqlite", "rejected", 0.001, 5);
  assert.equal(valueOf(await scrape(m), "cairn_storage_committed_events_total", { adapter: "sqlite" }) ?? 0, 0);
});

for (const end of ["fenced", "closed"] as const) {
  test(`${end}() after opened() drops cairn_owner to 0`, async () => {
    const m = new Metrics({ defaultMetrics: false });
    m.opened();
    assert.equal(valueOf(await scrape(m), "cairn_owner"), 1);
    m[end]();
    assert.equal(valueOf(await scrape(m), "cairn_owner"), 0);
  });
}

test("stats an adapter does not report leave their series absent (no false quorum alert)", async () => {
  const m = new Metrics({ defaultMetrics: false });
  m.storageStats({ adapter: "sqlite", epoch: 3, fenced: false, poisoned: false });
  const samples = await scrape(m);
  assert.equal(valueOf(samples, "cairn_storage_quorum_held", { adapter: "sqlite" }), undefined);
  assert.equal(valueOf(samples, "cairn_storage_backlog_commits", { adapter: "sqlite" }), undefined);
  assert.equal(valueOf(samples, "cairn_ownership_epoch", { adapter: "sqlite" }), 3);
  assert.equal(valueOf(samples, "cairn_storage_reachable", { adapter: "sqlite" }), 1);
});

test("invalid values are ignored, never thrown into the harness", async () => {
  const m = new Metrics({ defaultMetrics: false });
  m.tokens(-5, Number.NaN);
  m.setInbox(Number.POSITIVE_INFINITY);
  m.commit("sqlite", "ok", -1, -2);
  const samples = await scrape(m);
  assert.equal(valueOf(samples, "cairn_model_tokens_total", { direction: "input" }), 0);
  assert.equal(valueOf(samples, "cairn_inbox_depth"), 0);
  assert.equal(valueOf(samples, "cairn_storage_commits_total", { adapter: "sqlite", outcome: "ok" }), 1);
  assert.equal(valueOf(samples, "cairn_storage_commit_duration_seconds_count", { adapter: "sqlite" }) ?? 0, 0);
});

test("the adapter option starts its commit series at 0, so increase() sees the first one", async () => {
  const m = new Metrics({ defaultMetrics: false, adapter: "replicated" });
  const samples = await scrape(m);
  for (const outcome of ["ok", "rejected", "uncertain", "fenced"]) {
    assert.equal(valueOf(samples, "cairn_storage_commits_total", { adapter: "replicated", outcome }), 0, outcome);
  }
});

test("labels are bounded: no metric has a session, cell or id label, and rejection codes are the admission set", async () => {
  const m = new Metrics({ defaultMetrics: false, adapter: "memory" });
  m.commit("memory", "ok", 0.001, 1);
  m.executionFinished("cmd", "success", 1);
  m.patchRejected("anything-unexpected");
  const allowed = new Set(["adapter", "outcome", "kind", "result", "code", "direction", "action", "version", "node", "le"]);
  const samples = await scrape(m);
  for (const s of samples.filter((x) => x.name.startsWith("cairn_"))) {
    for (const label of Object.keys(s.labels)) assert.ok(allowed.has(label), `${s.name} has unbounded label ${label}`);
  }
  const codes = new Set(samples.filter((s) => s.name === "cairn_patches_rejected_total").map((s) => s.labels.code));
  assert.deepEqual(codes, new Set([...REJECTION_CODES, "other"]));
  // The API takes no id: passing one is a type error (checked by `tsc`, which includes test/).
  // @ts-expect-error commit() has no session parameter
  m.commit("memory", "ok", 0.001, 1, "session-1");
});

test("cairn_build_info carries the version and node, value 1", async () => {
  const samples = await scrape(new Metrics({ defaultMetrics: false }));
  assert.equal(valueOf(samples, "cairn_build_info", { version: VERSION, node: process.version }), 1);
});

test("default process metrics are collected on the harness registry, and only there", async () => {
  const m = new Metrics();
  const samples = await scrape(m);
  assert.ok(valueOf(samples, "process_cpu_user_seconds_total") !== undefined, "process_cpu_user_seconds_total missing");
  assert.ok(samples.some((s) => s.name === "nodejs_eventloop_lag_seconds"), "nodejs_eventloop_lag_seconds missing");
  assert.equal(valueOf(await scrape(new Metrics({ defaultMetrics: false })), "process_cpu_user_seconds_total"), undefined);
});

test("two harnesses in one process keep separate registries; one registry cannot hold two", async () => {
  const a = new Metrics({ defaultMetrics: false });
  const b = new Metrics({ defaultMetrics: false });
  a.runStarted();
  assert.equal(valueOf(await scrape(a), "cairn_runs_started_total"), 1);
  assert.equal(valueOf(await scrape(b), "cairn_runs_started_total"), 0);
  const shared = new Registry();
  new Metrics({ registry: shared, defaultMetrics: false });
  assert.throws(() => new Metrics({ registry: shared, defaultMetrics: false }), /already been registered/);
});

test("onScrape hooks run before the same scrape renders, a throwing hook is ignored, and removal stops them", async () => {
  const m = new Metrics();
  let backlog = 0;
  const remove = m.onScrape(() => {
    backlog += 1;
    m.storageStats({ adapter: "replicated", epoch: 2, fenced: false, poisoned: false, backlogCommits: backlog });
    m.setRunsActive(backlog);
  });
  m.onScrape(() => {
    throw new Error("hook bug");
  });
  let samples = await scrape(m);
  assert.equal(valueOf(samples, "cairn_storage_backlog_commits", { adapter: "replicated" }), 1);
  assert.equal(valueOf(samples, "cairn_runs_active"), 1);
  samples = await scrape(m);
  assert.equal(valueOf(samples, "cairn_storage_backlog_commits", { adapter: "replicated" }), 2);
  remove();
  samples = await scrape(m);
  assert.equal(valueOf(samples, "cairn_storage_backlog_commits", { adapter: "replicated" }), 2);
});
