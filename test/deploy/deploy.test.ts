/**
 * The deployment files in deploy/ are checked with what exists offline here:
 * - systemd: `systemd-analyze verify` on an instance of the template unit;
 * - Kubernetes: every manifest parses (YAML), every object has apiVersion, kind and a name, the
 *   workers have /healthz liveness and /readyz readiness probes, and etcd members are spread over
 *   zones (no schema server or kubeconform is reachable here: said in deploy/README.md);
 * - Nomad: the job parses as HCL (a small parser below: blocks, attributes, strings, heredocs, lists)
 *   and has the checks the workers need (`nomad job validate` is not installed here);
 * - every `cairn serve` flag has an environment variable, and the variables these files set are ones
 *   `cairn serve` reads;
 * - safe as shipped (./checks.ts): etcd over TLS with client certificates on both sides and
 *   authentication with one role per database (roles.sh, run by a Job), workers as a non-root user
 *   with no capabilities and a read-only root file system, the access token from a secret, bubblewrap
 *   in the image, the systemd unit hardened. Each check is also run on a copy of the file with its
 *   protection removed, and must fail there.
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
import { dockerfileProblems, etcdProblems, nomadProblems, systemdProblems, workerProblems, type K8sObject } from "./checks.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const read = (p: string) => readFileSync(join(root, p), "utf8");
const yaml = (await import("js-yaml" as string)) as { loadAll(text: string): unknown[] };

/** Environment variables `cairn serve` reads: one per flag, the access token, and the credentials the adapters read. */
const SERVE_ENV = new Set([
  ...Object.keys(SERVE_FLAGS).map(envName),
  "CAIRN_UI_TOKEN",
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
  assert.deepEqual(systemdProblems(text), []);
  assert.match(text, /^Restart=always$/m);
  assert.match(text, /^Environment=CAIRN_DB=%i$/m);
  for (const [, name] of text.matchAll(/^Environment=(CAIRN_[A-Z_]+)=/gm)) assert.ok(SERVE_ENV.has(name!), `${name} is not read by cairn serve`);
});

function objects(file: string): K8sObject[] {
  return yaml.loadAll(read(file)).filter((d) => d !== null) as K8sObject[];
}

test("Kubernetes: manifests parse; workers have probes, env configuration, one StatefulSet per database; etcd spreads over zones", () => {
  const workers = objects("deploy/kubernetes/cairn-workers.yaml");
  const etcd = objects("deploy/kubernetes/etcd.yaml");
  const roles = objects("deploy/kubernetes/etcd-roles.yaml");
  for (const o of [...workers, ...etcd, ...roles]) {
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
    for (const k of Object.keys(env.attrs)) if (k.startsWith("CAIRN_")) assert.ok(SERVE_ENV.has(k), `${k} is not read by cairn serve`);
  }
});

test("the container image: a Dockerfile whose base image is a build argument, and a .dockerignore that keeps data and secrets out", () => {
  const docker = read("deploy/Dockerfile");
  assert.deepEqual(dockerfileProblems(docker), []);
  const lines = docker.split("\n").filter((l) => l.trim() !== "" && !l.trim().startsWith("#"));
  assert.match(lines[0]!, /^ARG BASE=/);
  assert.match(lines[1]!, /^FROM \$\{BASE\}$/);
  for (const l of lines) assert.match(l, /^(ARG|FROM|COPY|WORKDIR|ENTRYPOINT|CMD|ENV|USER|RUN|EXPOSE|LABEL) /, l);
  const ignore = read(".dockerignore").split("\n");
  for (const p of [".git", ".cairn", "**/*.pem", "**/*.key"]) assert.ok(ignore.includes(p), `.dockerignore lacks ${p}`);
});

// ---- safe as shipped (./checks.ts), and each check failing on a file with its protection removed ----

/** A deep copy of `v` changed by `edit`. */
function mutated<T>(v: T, edit: (copy: T) => void): T {
  const copy = structuredClone(v);
  edit(copy);
  return copy;
}

/** Asserts that `problems` holds one matching `re`: the check noticed what was removed. */
function caught(problems: string[], re: RegExp, what: string): void {
  assert.ok(problems.some((p) => re.test(p)), `${what}: the check did not notice (problems: ${JSON.stringify(problems)})`);
}

type Any = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const workerSet = (objs: K8sObject[]): Any => objs.find((o) => o.kind === "StatefulSet") as Any;
const workerContainer = (objs: K8sObject[]): Any => workerSet(objs).spec.template.spec.containers[0];

test("Kubernetes, safe as shipped: etcd over TLS with client certificates, non-root; workers non-root, read-only, token from a Secret; a roles Job per database", () => {
  const workers = objects("deploy/kubernetes/cairn-workers.yaml");
  const etcd = objects("deploy/kubernetes/etcd.yaml");
  const roles = objects("deploy/kubernetes/etcd-roles.yaml");
  assert.deepEqual(etcdProblems(etcd), []);
  assert.deepEqual(workerProblems(workers, roles), []);

  // etcd: drop TLS or client-certificate checks, run as root, open the client port.
  const etcdFlag = (objs: K8sObject[], from: string, to: string) => {
    const c = workerSet(objs).spec.template.spec.containers[0];
    c.command = (c.command as string[]).map((a) => a.replace(from, to));
  };
  caught(etcdProblems(mutated(etcd, (o) => etcdFlag(o, "--listen-client-urls=https://", "--listen-client-urls=http://"))), /listen-client-urls is not https/, "plain http clients");
  caught(etcdProblems(mutated(etcd, (o) => etcdFlag(o, "--listen-peer-urls=https://", "--listen-peer-urls=http://"))), /listen-peer-urls is not https/, "plain http peers");
  caught(etcdProblems(mutated(etcd, (o) => etcdFlag(o, "--client-cert-auth=true", "--client-cert-auth=false"))), /client-cert-auth is not true/, "no client certificates");
  caught(etcdProblems(mutated(etcd, (o) => etcdFlag(o, "--peer-client-cert-auth=true", "--peer-client-cert-auth=false"))), /peer-client-cert-auth/, "no peer certificates");
  caught(etcdProblems(mutated(etcd, (o) => (workerSet(o).spec.template.spec.securityContext.runAsUser = 0))), /runAsUser/, "etcd as root");
  caught(etcdProblems(mutated(etcd, (o) => (workerSet(o).spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem = false))), /readOnlyRootFilesystem/, "etcd writable root");
  caught(etcdProblems(etcd.filter((o) => o.kind !== "NetworkPolicy")), /NetworkPolicy/, "etcd open to every pod");

  // Workers: root, privilege escalation, capabilities, a writable root, the token in clear or gone, http etcd.
  caught(workerProblems(mutated(workers, (o) => (workerSet(o).spec.template.spec.securityContext.runAsUser = 0)), roles), /runAsUser is not a non-zero uid/, "workers as root");
  caught(workerProblems(mutated(workers, (o) => delete workerSet(o).spec.template.spec.securityContext.runAsNonRoot), roles), /runAsNonRoot/, "runAsNonRoot dropped");
  caught(workerProblems(mutated(workers, (o) => (workerContainer(o).securityContext.allowPrivilegeEscalation = true)), roles), /allowPrivilegeEscalation/, "privilege escalation");
  caught(workerProblems(mutated(workers, (o) => (workerContainer(o).securityContext.readOnlyRootFilesystem = false)), roles), /readOnlyRootFilesystem/, "writable root");
  caught(workerProblems(mutated(workers, (o) => (workerContainer(o).securityContext.capabilities.drop = [])), roles), /capabilities are not dropped/, "capabilities kept");
  caught(workerProblems(mutated(workers, (o) => (workerContainer(o).securityContext.privileged = true)), roles), /privileged/, "privileged");
  caught(workerProblems(mutated(workers, (o) => delete workerSet(o).spec.template.spec.automountServiceAccountToken), roles), /Kubernetes API token/, "API token mounted");
  caught(
    workerProblems(mutated(workers, (o) => (workerContainer(o).env = (workerContainer(o).env as Any[]).filter((e) => e.name !== "CAIRN_UI_TOKEN"))), roles),
    /access token does not come from a Secret/,
    "no token",
  );
  caught(
    workerProblems(mutated(workers, (o) => ((workerContainer(o).env as Any[]).find((e) => e.name === "CAIRN_UI_TOKEN")!.valueFrom = undefined, ((workerContainer(o).env as Any[]).find((e) => e.name === "CAIRN_UI_TOKEN")!.value = "in-the-manifest-0123456789"))), roles),
    /token is written in the manifest/,
    "token in clear",
  );
  caught(workerProblems(mutated(workers, (o) => ((o.find((x) => x.kind === "ConfigMap") as Any).data.CAIRN_NO_AUTH = "true")), roles), /CAIRN_NO_AUTH/, "--no-auth");
  caught(
    workerProblems(mutated(workers, (o) => { const d = (o.find((x) => x.kind === "ConfigMap") as Any).data; d.CAIRN_ETCD_ENDPOINTS = String(d.CAIRN_ETCD_ENDPOINTS).replaceAll("https://", "http://"); }), roles),
    /CAIRN_ETCD_ENDPOINTS is not https/,
    "workers to etcd over http",
  );
  caught(workerProblems(mutated(workers, (o) => delete (o.find((x) => x.kind === "ConfigMap") as Any).data.CAIRN_ETCD_KEY), roles), /CAIRN_ETCD_KEY is not set/, "no client certificate");
  caught(
    workerProblems(mutated(workers, (o) => (workerContainer(o).volumeMounts = (workerContainer(o).volumeMounts as Any[]).filter((m) => m.mountPath !== "/tmp"))), roles),
    /\/tmp must be a volume/,
    "/tmp not writable",
  );
  // The roles Job: per database, turning authentication on, its secrets from Secrets.
  caught(workerProblems(workers, []), /no etcd roles Job for database harness-1/, "no roles Job");
  const rolesContainer = (o: K8sObject[]): Any => (o.find((x) => x.kind === "Job") as Any).spec.template.spec.containers[0];
  caught(workerProblems(workers, mutated(roles, (o) => (rolesContainer(o).env = (rolesContainer(o).env as Any[]).filter((e) => e.name !== "CAIRN_ETCD_ENABLE_AUTH")))), /authentication on/, "auth not enabled");
  caught(workerProblems(workers, mutated(roles, (o) => (rolesContainer(o).securityContext.allowPrivilegeEscalation = true))), /allowPrivilegeEscalation/, "roles Job escalating");
});

test("Kubernetes: the roles Job's image runs deploy/etcd/roles.sh; the etcd config file serves TLS with client certificates", () => {
  const dockerfile = read("deploy/etcd/Dockerfile.roles");
  assert.match(dockerfile, /^COPY roles\.sh \/usr\/local\/bin\/cairn-etcd-roles\.sh$/m);
  assert.match(dockerfile, /^ENTRYPOINT \["\/bin\/sh", "\/usr\/local\/bin\/cairn-etcd-roles\.sh"\]$/m);
  assert.match(dockerfile, /^USER 65532:65532$/m);
  const job = objects("deploy/kubernetes/etcd-roles.yaml").find((o) => o.kind === "Job") as Any;
  assert.equal(job.spec.template.spec.containers[0].image, "cairn-etcd-roles:latest");
  const conf = yaml.loadAll(read("deploy/etcd/etcd.conf.yml"))[0] as Any;
  for (const k of ["listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls"]) assert.match(conf[k], /^https:\/\//, k);
  assert.equal(conf["client-transport-security"]["client-cert-auth"], true);
  assert.equal(conf["peer-transport-security"]["client-cert-auth"], true);
});

test("Nomad, safe as shipped: non-root, read-only, no capabilities, TLS to etcd, the token from secrets/", () => {
  const job = find(parseHcl(read("deploy/nomad/cairn.nomad.hcl")), "job")[0]!;
  assert.deepEqual(nomadProblems(job), []);
  const task = (j: HclBody): HclBody => find(find(j, "group")[0]!, "task")[0]!;
  const config = (j: HclBody): HclBody => find(task(j), "config")[0]!;
  const env = (j: HclBody): HclBody => find(task(j), "env")[0]!;
  caught(nomadProblems(mutated(job, (j) => delete task(j).attrs.user)), /runs as root/, "no user");
  caught(nomadProblems(mutated(job, (j) => (task(j).attrs.user = "root"))), /runs as root/, "user root");
  caught(nomadProblems(mutated(job, (j) => (config(j).attrs.readonly_rootfs = false))), /readonly_rootfs/, "writable root");
  caught(nomadProblems(mutated(job, (j) => (config(j).attrs.cap_drop = []))), /capabilities/, "capabilities kept");
  caught(nomadProblems(mutated(job, (j) => (config(j).attrs.security_opt = ["seccomp=unconfined"]))), /no-new-privileges/, "new privileges");
  caught(nomadProblems(mutated(job, (j) => (env(j).attrs.CAIRN_ETCD_ENDPOINTS = "http://etcd-a.service:2379"))), /not https/, "etcd over http");
  caught(nomadProblems(mutated(job, (j) => delete env(j).attrs.CAIRN_TOKEN_FILE)), /token is not read/, "no token");
  caught(nomadProblems(mutated(job, (j) => (env(j).attrs.CAIRN_NO_AUTH = "true"))), /CAIRN_NO_AUTH/, "--no-auth");
});

test("systemd, safe as shipped: systemd-analyze security rates the unit OK, and each hardening removed is caught", { skip: systemdAnalyze ? false : "systemd-analyze is not installed: the unit was NOT rated" }, async () => {
  const text = read("deploy/systemd/cairn-serve@.service");
  const dir = mkdtempSync(join(tmpdir(), "cairn-unit-"));
  try {
    const unit = join(dir, "cairn-serve@harness-1.service");
    copyFileSync(join(root, "deploy/systemd/cairn-serve@.service"), unit);
    const out = await new Promise<string>((resolve) => execFile("systemd-analyze", ["security", "--offline=true", unit], (_err, stdout, stderr) => resolve(`${stdout}${stderr}`)));
    const level = /Overall exposure level for \S+: (\d+\.\d+)/.exec(out);
    assert.ok(level, out);
    assert.ok(Number(level[1]) <= 4, `exposure ${level[1]}: ${out.split("\n").filter((l) => l.startsWith("✗")).join("\n")}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const without = (re: RegExp): string => text.split("\n").filter((l) => !re.test(l)).join("\n");
  caught(systemdProblems(text.replace(/^User=cairn$/m, "User=root")), /User= is missing or root/, "User=root");
  caught(systemdProblems(without(/^User=/)), /User= is missing/, "no User=");
  caught(systemdProblems(without(/^NoNewPrivileges=/)), /NoNewPrivileges/, "new privileges");
  caught(systemdProblems(text.replace("ProtectSystem=strict", "ProtectSystem=full")), /ProtectSystem/, "system writable");
  caught(systemdProblems(without(/^CapabilityBoundingSet=/)), /CapabilityBoundingSet/, "capabilities kept");
  caught(systemdProblems(without(/^LoadCredential=ui-token/)), /access token is not a credential/, "no token");
  caught(systemdProblems(without(/^Environment=CAIRN_ETCD_KEY=/)), /CAIRN_ETCD_KEY is not a credential/, "no client key");
  caught(systemdProblems(`${text}\nReadWritePaths=/\n`), /opens the system/, "ReadWritePaths=/");
});

test("the image, safe as shipped: a numeric non-root USER and bubblewrap", () => {
  const docker = read("deploy/Dockerfile");
  assert.deepEqual(dockerfileProblems(docker), []);
  caught(dockerfileProblems(docker.replace(/^USER .*$/m, "")), /no USER/, "no USER");
  caught(dockerfileProblems(docker.replace(/^USER .*$/m, "USER root")), /not a numeric non-root uid/, "USER root");
  caught(dockerfileProblems(docker.replace(/^USER .*$/m, "USER 0:0")), /not a numeric non-root uid/, "USER 0");
  caught(dockerfileProblems(docker.replace(/^RUN .*bubblewrap.*$/m, "")), /bubblewrap/, "no bwrap");
});
