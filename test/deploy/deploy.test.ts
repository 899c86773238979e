/**
 * Issue 9: the deployment files in deploy/ are checked with what exists offline here:
 * - systemd: `systemd-analyze verify` on an instance of the template unit;
 * - Kubernetes: every manifest parses (YAML), every object has apiVersion, kind and a name, the
 *   workers have /healthz liveness and /readyz readiness probes, and etcd members are spread over
 *   zones (no schema server or kubeconform is reachable here: said in deploy/README.md);
 * - Nomad: the job parses as HCL (a small parser below: blocks, attributes, strings, heredocs, lists)
 *   and has the checks the workers need (`nomad job validate` is not installed here);
 * - every `cairn serve` flag has an environment variable, and the variables these files set are ones
 *   `cairn serve` reads.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { SERVE_FLAGS } from "../../src/cli/serve.js";
import { envName } from "../../src/cli/owner.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const read = (p: string) => readFileSync(join(root, p), "utf8");
const yaml = (await import("js-yaml" as string)) as { loadAll(text: string): unknown[] };

/** Environment variables `cairn serve` reads: one per flag, plus the credentials the adapters read. */
const SERVE_ENV = new Set([
  ...Object.keys(SERVE_FLAGS).map(envName),
  "CAIRN_ETCD_USER",
  "CAIRN_ETCD_PASSWORD",
  "CAIRN_ETCD_CA",
  "CAIRN_ETCD_CERT",
  "CAIRN_ETCD_KEY",
]);

test("every `cairn serve` flag has an environment variable, named CAIRN_<FLAG>", () => {
  for (const flag of Object.keys(SERVE_FLAGS)) assert.match(envName(flag), /^CAIRN_[A-Z_]+$/, flag);
  assert.equal(envName("data-dir"), "CAIRN_DATA_DIR");
  assert.equal(envName("etcd"), "CAIRN_ETCD_ENDPOINTS");
  assert.ok(SERVE_ENV.has("CAIRN_TAKEOVER") && SERVE_ENV.has("CAIRN_CREATE") && SERVE_ENV.has("CAIRN_LISTEN"));
});

const systemdAnalyze = await new Promise<boolean>((resolve) => execFile("systemd-analyze", ["--version"], (err) => resolve(err === null)));

test("systemd: systemd-analyze verify accepts an instance of the template unit", { skip: systemdAnalyze ? false : "systemd-analyze is not installed: the unit was NOT verified" }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "cairn-unit-"));
  try {
    const unit = join(dir, "cairn-serve@harness-1.service");
    copyFileSync(join(root, "deploy/systemd/cairn-serve@.service"), unit);
    const out = await new Promise<{ code: number; text: string }>((resolve) =>
      execFile("systemd-analyze", ["verify", unit], (err, stdout, stderr) => resolve({ code: err ? 1 : 0, text: `${stdout}${stderr}` })),
    );
    assert.equal(out.code, 0, out.text);
    assert.equal(out.text.trim(), "", `systemd-analyze has remarks:\n${out.text}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const text = read("deploy/systemd/cairn-serve@.service");
  assert.match(text, /^Restart=always$/m);
  assert.match(text, /^Environment=CAIRN_DB=%i$/m);
  for (const [, name] of text.matchAll(/^Environment=(CAIRN_[A-Z_]+)=/gm)) assert.ok(SERVE_ENV.has(name!), `${name} is not read by cairn serve`);
});

interface K8sObject {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; namespace?: string };
  spec?: Record<string, unknown>;
  data?: Record<string, string>;
}

function objects(file: string): K8sObject[] {
  return yaml.loadAll(read(file)).filter((d) => d !== null) as K8sObject[];
}

test("Kubernetes: manifests parse; workers have probes, env configuration, one StatefulSet per database; etcd spreads over zones", () => {
  const workers = objects("deploy/kubernetes/cairn-workers.yaml");
  const etcd = objects("deploy/kubernetes/etcd.yaml");
  for (const o of [...workers, ...etcd]) {
    assert.ok(o.apiVersion && o.kind && o.metadata?.name, `incomplete object: ${JSON.stringify(o).slice(0, 200)}`);
    if (o.kind !== "Namespace") assert.equal(o.metadata?.namespace, "cairn");
  }
  const sets = workers.filter((o) => o.kind === "StatefulSet") as unknown as {
    metadata: { name: string };
    spec: { replicas: number; template: { spec: { containers: { args: string[]; env: { name: string; value?: string }[]; envFrom: unknown[]; livenessProbe: { httpGet: { path: string } }; readinessProbe: { httpGet: { path: string } } }[] } } };
  }[];
  assert.ok(sets.length >= 1);
  for (const s of sets) {
    assert.ok(s.spec.replicas >= 2, "a standby beside the owner");
    const c = s.spec.template.spec.containers[0]!;
    assert.deepEqual(c.args, ["serve"], "configuration through the environment, not flags");
    assert.equal(c.livenessProbe.httpGet.path, "/healthz");
    assert.equal(c.readinessProbe.httpGet.path, "/readyz");
    const db = c.env.find((e) => e.name === "CAIRN_DB")?.value;
    assert.equal(s.metadata.name, `cairn-${db}`, "one StatefulSet per database, named after it");
    for (const e of c.env) if (e.name.startsWith("CAIRN_")) assert.ok(SERVE_ENV.has(e.name), `${e.name} is not read by cairn serve`);
  }
  const config = workers.find((o) => o.kind === "ConfigMap")!;
  for (const k of Object.keys(config.data!)) assert.ok(SERVE_ENV.has(k), `${k} is not read by cairn serve`);
  const etcdSet = etcd.find((o) => o.kind === "StatefulSet") as unknown as { spec: { replicas: number; template: { spec: { topologySpreadConstraints: { topologyKey: string; whenUnsatisfiable: string; maxSkew: number }[] } } } };
  assert.equal(etcdSet.spec.replicas, 3);
  const spread = etcdSet.spec.template.spec.topologySpreadConstraints[0]!;
  assert.deepEqual([spread.topologyKey, spread.whenUnsatisfiable, spread.maxSkew], ["topology.kubernetes.io/zone", "DoNotSchedule", 1]);
});

// ---- a small HCL parser (the subset job files use) -------------------------------------------------

type HclValue = string | number | boolean | HclValue[] | HclBody;
interface HclBody {
  attrs: Record<string, HclValue>;
  blocks: { type: string; labels: string[]; body: HclBody }[];
}

/** Parses HCL text; throws with a line number on a syntax error. */
function parseHcl(text: string): HclBody {
  let i = 0;
  let line = 1;
  const fail = (why: string): never => {
    throw new Error(`HCL syntax error on line ${line}: ${why}`);
  };
  const skip = (newlines: boolean) => {
    for (;;) {
      const ch = text[i];
      if (ch === "#" || (ch === "/" && text[i + 1] === "/")) while (i < text.length && text[i] !== "\n") i++;
      else if (ch === " " || ch === "\t" || ch === "\r") i++;
      else if (ch === "\n" && newlines) {
        line++;
        i++;
      } else return;
    }
  };
  const ident = (): string => {
    const m = /^[A-Za-z_][A-Za-z0-9_-]*/.exec(text.slice(i));
    if (!m) return fail(`expected a name, found ${JSON.stringify(text.slice(i, i + 10))}`);
    i += m[0].length;
    return m[0];
  };
  const string = (): string => {
    i++; // opening quote
    let out = "";
    while (text[i] !== '"') {
      if (i >= text.length || text[i] === "\n") fail("unterminated string");
      if (text[i] === "\\") i++;
      else if (text[i] === "$" && text[i + 1] === "{") {
        const end = text.indexOf("}", i);
        if (end < 0) fail("unterminated interpolation");
        out += text.slice(i, end + 1);
        i = end + 1;
        continue;
      }
      out += text[i++];
    }
    i++;
    return out;
  };
  const value = (): HclValue => {
    skip(false);
    const ch = text[i];
    if (ch === '"') return string();
    if (ch === "<" && text.startsWith("<<", i)) {
      const m = /^<<-?([A-Z]+)\n/.exec(text.slice(i));
      if (!m) return fail("bad heredoc");
      i += m[0].length;
      line++;
      const end = new RegExp(`^\\s*${m[1]}$`, "m");
      const rest = text.slice(i);
      const found = end.exec(rest);
      if (!found) return fail(`heredoc ${m[1]} is not closed`);
      const body = rest.slice(0, found.index);
      line += body.split("\n").length - 1;
      i += found.index + found[0].length;
      return body;
    }
    if (ch === "[") {
      i++;
      const items: HclValue[] = [];
      for (;;) {
        skip(true);
        if (text[i] === "]") {
          i++;
          return items;
        }
        items.push(value());
        skip(true);
        if (text[i] === ",") i++;
        else if (text[i] !== "]") fail("expected , or ] in a list");
      }
    }
    if (ch === "{") {
      i++;
      const b = body("}");
      i++;
      return b;
    }
    const m = /^(-?\d+(\.\d+)?|true|false)/.exec(text.slice(i));
    if (!m) return fail(`expected a value, found ${JSON.stringify(text.slice(i, i + 10))}`);
    i += m[0].length;
    return m[0] === "true" ? true : m[0] === "false" ? false : Number(m[0]);
  };
  const body = (close: string | null): HclBody => {
    const b: HclBody = { attrs: {}, blocks: [] };
    for (;;) {
      skip(true);
      if (i >= text.length) {
        if (close !== null) fail(`missing ${close}`);
        return b;
      }
      if (text[i] === close) return b;
      const name = ident();
      skip(false);
      if (text[i] === "=") {
        i++;
        if (name in b.attrs) fail(`attribute ${name} set twice`);
        b.attrs[name] = value();
        skip(false);
        if (text[i] !== "\n" && text[i] !== undefined && text[i] !== close) fail(`unexpected ${JSON.stringify(text[i])} after ${name}`);
        continue;
      }
      const labels: string[] = [];
      while (text[i] === '"') {
        labels.push(string());
        skip(false);
      }
      if (text[i] !== "{") fail(`expected = or { after ${name}`);
      i++;
      b.blocks.push({ type: name, labels, body: body("}") });
      i++;
    }
  };
  return body(null);
}

const find = (b: HclBody, type: string): HclBody[] => b.blocks.filter((x) => x.type === type).map((x) => x.body);

test("Nomad: the job parses as HCL, restarts on exit, checks /readyz, configures through env, spreads over zones", () => {
  assert.throws(() => parseHcl('job "x" {\n  a = "unterminated\n}\n'), /line 2/);
  assert.throws(() => parseHcl('job "x" {\n  a = 1\n'), /missing \}/);
  const job = parseHcl(read("deploy/nomad/cairn.nomad.hcl"));
  const [j] = find(job, "job");
  assert.ok(j);
  const groups = j.blocks.filter((x) => x.type === "group");
  assert.ok(groups.length >= 1);
  for (const g of groups) {
    assert.ok((g.body.attrs.count as number) >= 2, "a standby beside the owner");
    assert.ok(find(g.body, "spread").length === 1);
    const check = find(find(g.body, "service")[0]!, "check")[0]!;
    assert.equal(check.attrs.path, "/readyz");
    const task = find(g.body, "task")[0]!;
    const env = find(task, "env")[0]!;
    assert.equal(env.attrs.CAIRN_DB, g.labels[0], "one group per database, named after it");
    for (const k of Object.keys(env.attrs)) assert.ok(SERVE_ENV.has(k), `${k} is not read by cairn serve`);
  }
});

test("the container image: a Dockerfile whose base image is a build argument, and a .dockerignore that keeps data and secrets out", () => {
  const docker = read("deploy/Dockerfile");
  const lines = docker.split("\n").filter((l) => l.trim() !== "" && !l.trim().startsWith("#"));
  assert.match(lines[0]!, /^ARG BASE=/);
  assert.match(lines[1]!, /^FROM \$\{BASE\}$/);
  for (const l of lines) assert.match(l, /^(ARG|FROM|COPY|WORKDIR|ENTRYPOINT|CMD|ENV|USER|RUN|EXPOSE|LABEL) /, l);
  const ignore = read(".dockerignore").split("\n");
  for (const p of [".git", ".cairn", "**/*.pem", "**/*.key"]) assert.ok(ignore.includes(p), `.dockerignore lacks ${p}`);
});
