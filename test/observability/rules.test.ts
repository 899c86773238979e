import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Metrics } from "../../src/observability/metrics.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const RULES = join(root, "deploy/prometheus/cairn-alerts.yml");
const RULE_TESTS = join(root, "deploy/prometheus/cairn-alerts.test.yml");
const PROMETHEUS = join(root, "deploy/prometheus/prometheus.yml");
const DASHBOARD = join(root, "deploy/grafana/cairn-dashboard.json");

function promtool(args: string[]): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile("promtool", args, { timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === "number" ? (err as { code: number }).code : -1;
      resolve({ code, output: `${stdout}${stderr}` });
    });
  });
}

const hasPromtool = await new Promise<boolean>((resolve) => execFile("promtool", ["--version"], (err) => resolve(err === null)));
const skip = hasPromtool ? false : "promtool is not installed (apt-get install prometheus; .ci/run installs it): alert rules NOT checked";
if (!hasPromtool) console.warn(`SKIPPING promtool checks: ${skip}`);

interface DashboardPanel {
  type: string;
  title: string;
  targets?: { expr: string }[];
}
interface Dashboard {
  panels: DashboardPanel[];
  annotations: { list: { expr?: string }[] };
  templating: { list: { query?: unknown; definition?: string }[] };
}

async function dashboard(): Promise<Dashboard> {
  return JSON.parse(await readFile(DASHBOARD, "utf8")) as Dashboard;
}

/** Every PromQL expression in the dashboard: panel targets and annotations. */
function dashboardExprs(d: Dashboard): string[] {
  const exprs = d.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
  for (const a of d.annotations.list) if (a.expr !== undefined) exprs.push(a.expr);
  return exprs;
}

/** The metric names (`cairn_...`) a text uses, with histogram suffixes mapped to their base. */
function cairnNames(text: string, known: ReadonlySet<string>): Set<string> {
  const names = new Set<string>();
  for (const [name] of text.matchAll(/\bcairn_[a-z_]+/g)) {
    const base = name.replace(/_(bucket|sum|count)$/, "");
    names.add(base !== name && known.has(base) ? base : name);
  }
  return names;
}

async function registryNames(): Promise<Set<string>> {
  const metrics = await new Metrics().registry.getMetricsAsJSON();
  return new Set(metrics.map((m) => m.name));
}

test("promtool check rules accepts the alert rules", { skip }, async () => {
  const { code, output } = await promtool(["check", "rules", RULES]);
  assert.equal(code, 0, output);
  assert.match(output, /SUCCESS: 15 rules found/);
});

test("promtool test rules: every alert fires on its condition and stays quiet on a near miss", { skip }, async () => {
  const { code, output } = await promtool(["test", "rules", RULE_TESTS]);
  assert.equal(code, 0, output);
  assert.match(output, /SUCCESS/);
});

test("promtool check config accepts the example prometheus.yml (and the rule file it loads)", { skip }, async () => {
  // promtool checks that the scrape's token file exists: a copy beside the rules names a temporary one.
  const dir = await mkdtemp(join(tmpdir(), "cairn-prom-"));
  try {
    const token = join(dir, "cairn-token");
    await writeFile(token, "a-token-of-at-least-16-characters\n");
    const config = (await readFile(PROMETHEUS, "utf8")).replaceAll("/etc/prometheus/secrets/cairn-token", token);
    assert.ok(config.includes(token), "the example sends the token from a credentials file");
    await writeFile(join(dir, "prometheus.yml"), config);
    await writeFile(join(dir, "cairn-alerts.yml"), await readFile(RULES, "utf8"));
    const { code, output } = await promtool(["check", "config", join(dir, "prometheus.yml")]);
    assert.equal(code, 0, output);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("every dashboard expression is valid PromQL (checked by promtool as recording rules)", { skip }, async () => {
  const exprs = dashboardExprs(await dashboard()).map((e) => e.replaceAll("$__rate_interval", "5m").replaceAll("$instance", ".*"));
  assert.ok(exprs.length >= 20, `only ${exprs.length} expressions`);
  // JSON is YAML: no YAML library needed.
  const rules = { groups: [{ name: "dashboard", rules: exprs.map((expr, i) => ({ record: `dashboard:expr_${i}`, expr })) }] };
  const dir = await mkdtemp(join(tmpdir(), "cairn-dash-"));
  try {
    const file = join(dir, "dashboard-rules.yml");
    await writeFile(file, JSON.stringify(rules, null, 2));
    const { code, output } = await promtool(["check", "rules", file]);
    assert.equal(code, 0, output);
    assert.match(output, new RegExp(`SUCCESS: ${exprs.length} rules found`));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("every metric the alert rules use is defined by Metrics", async () => {
  const known = await registryNames();
  const used = cairnNames(await readFile(RULES, "utf8"), known);
  assert.ok(used.size >= 8, `rules use only ${[...used].join(", ")}`);
  for (const name of used) assert.ok(known.has(name), `alert rules use ${name}, which src/observability/metrics.ts does not define`);
});

test("every metric the dashboard uses is defined by Metrics, and every Cairn metric has a panel", async () => {
  const known = await registryNames();
  const d = await dashboard();
  const used = cairnNames(JSON.stringify(d), known);
  for (const name of used) assert.ok(known.has(name), `dashboard uses ${name}, which src/observability/metrics.ts does not define`);
  const cairnMetrics = [...known].filter((n) => n.startsWith("cairn_"));
  for (const name of cairnMetrics) assert.ok(used.has(name), `no dashboard panel shows ${name}`);
  const titles = d.panels.filter((p) => p.type === "timeseries").map((p) => p.title.toLowerCase());
  for (const topic of ["commit latency", "commits by outcome", "quorum", "backlog", "fenced", "executions", "rounds", "tokens", "inbox", "runs"]) {
    assert.ok(titles.some((t) => t.includes(topic)), `no panel about ${topic}`);
  }
});

test("the name check itself catches an unknown metric (so it cannot pass vacuously)", async () => {
  const known = await registryNames();
  const used = cairnNames("rate(cairn_storage_commit_duration_seconds_bucket[5m]) + cairn_made_up_total", known);
  assert.deepEqual([...used].sort(), ["cairn_made_up_total", "cairn_storage_commit_duration_seconds"]);
  assert.ok(!known.has("cairn_made_up_total"));
});
