/**
 * What "safe as shipped" means for each file in deploy/, as functions that list what a file gets
 * wrong (an empty list: nothing). test/deploy/deploy.test.ts runs them on the shipped files, and on
 * mutated copies (TLS dropped, root, no token...) to show that each check fails when its protection
 * is removed.
 */

/** A parsed YAML or HCL value, walked without trusting its shape. */
export type Tree = unknown;

/** `tree` at `path` (object keys), or undefined. */
export function at(tree: Tree, ...path: string[]): unknown {
  let v: unknown = tree;
  for (const k of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<string, unknown>)[k];
  }
  return v;
}

function arr(v: unknown): unknown[] {
  return Array.isArray(v) ? v : [];
}

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

/** A Kubernetes object as parsed from YAML. */
export interface K8sObject {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; namespace?: string; labels?: Record<string, string> };
  spec?: Record<string, unknown>;
  data?: Record<string, string>;
}

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { secretKeyRef?: { name: string; key: string }; fieldRef?: unknown };
}

/**
 * A container of a pod template: what it runs as and what it may do. Settings may be on the pod
 * (runAsNonRoot, runAsUser) or on the container; the container's win.
 */
function containerProblems(where: string, pod: Tree, c: Tree, writable: readonly string[]): string[] {
  const out: string[] = [];
  const podSc = at(pod, "securityContext");
  const sc = at(c, "securityContext");
  const pick = (k: string): unknown => at(sc, k) ?? at(podSc, k);
  if (pick("runAsNonRoot") !== true) out.push(`${where}: runAsNonRoot is not true`);
  const uid = pick("runAsUser");
  if (typeof uid !== "number" || uid === 0) out.push(`${where}: runAsUser is not a non-zero uid`);
  if (at(sc, "allowPrivilegeEscalation") !== false) out.push(`${where}: allowPrivilegeEscalation is not false`);
  if (at(sc, "readOnlyRootFilesystem") !== true) out.push(`${where}: readOnlyRootFilesystem is not true`);
  if (at(sc, "privileged") === true) out.push(`${where}: privileged`);
  const drop = arr(at(sc, "capabilities", "drop")).map(String);
  if (!drop.includes("ALL")) out.push(`${where}: capabilities are not dropped (drop: ["ALL"])`);
  if (arr(at(sc, "capabilities", "add")).length > 0) out.push(`${where}: capabilities added`);
  if (at(pod, "automountServiceAccountToken") !== false) out.push(`${where}: the Kubernetes API token is mounted (automountServiceAccountToken is not false)`);
  if (at(pod, "hostNetwork") === true || at(pod, "hostPID") === true) out.push(`${where}: host namespaces`);
  const mounts = arr(at(c, "volumeMounts")).map((m) => str(at(m, "mountPath")));
  for (const w of writable) if (!mounts.includes(w)) out.push(`${where}: ${w} must be a volume (the root file system is read-only)`);
  return out;
}

function podOf(set: K8sObject): Tree {
  return at(set, "spec", "template", "spec");
}

function envOf(c: Tree): EnvVar[] {
  return arr(at(c, "env")) as EnvVar[];
}

/** The workers' StatefulSets, their ConfigMap and the etcd roles Jobs (cairn-workers.yaml, etcd-roles.yaml). */
export function workerProblems(workers: readonly K8sObject[], roles: readonly K8sObject[]): string[] {
  const out: string[] = [];
  const config = workers.find((o) => o.kind === "ConfigMap")?.data ?? {};
  const sets = workers.filter((o) => o.kind === "StatefulSet");
  if (sets.length === 0) out.push("no worker StatefulSet");
  const endpoints = str(config.CAIRN_ETCD_ENDPOINTS).split(",").filter(Boolean);
  if (endpoints.length === 0 || !endpoints.every((e) => e.startsWith("https://"))) out.push(`CAIRN_ETCD_ENDPOINTS is not https only: ${config.CAIRN_ETCD_ENDPOINTS}`);
  if (config.CAIRN_NO_AUTH !== undefined) out.push("CAIRN_NO_AUTH is set");
  for (const set of sets) {
    const pod = podOf(set);
    const name = set.metadata?.name ?? "?";
    for (const c of arr(at(pod, "containers"))) {
      const where = `StatefulSet ${name} container ${str(at(c, "name"))}`;
      out.push(...containerProblems(where, pod, c, ["/var/lib/cairn", "/work", "/tmp", "/home/cairn"]));
      const env = envOf(c);
      const byName = (n: string): EnvVar | undefined => env.find((e) => e.name === n);
      const token = byName("CAIRN_UI_TOKEN");
      const tokenFile = byName("CAIRN_TOKEN_FILE") ?? (config.CAIRN_TOKEN_FILE !== undefined ? { name: "CAIRN_TOKEN_FILE" } : undefined);
      if (token?.valueFrom?.secretKeyRef === undefined && tokenFile === undefined) out.push(`${where}: the access token does not come from a Secret (CAIRN_UI_TOKEN secretKeyRef)`);
      if (token?.value !== undefined) out.push(`${where}: the access token is written in the manifest`);
      if (byName("CAIRN_NO_AUTH") !== undefined) out.push(`${where}: CAIRN_NO_AUTH is set`);
      for (const secretEnv of ["CAIRN_ETCD_PASSWORD", "ANTHROPIC_API_KEY"]) {
        const e = byName(secretEnv);
        if (e !== undefined && e.valueFrom?.secretKeyRef === undefined) out.push(`${where}: ${secretEnv} is not from a Secret`);
      }
      const mounts = arr(at(c, "volumeMounts")) as { name: string; mountPath: string }[];
      for (const k of ["CAIRN_ETCD_CA", "CAIRN_ETCD_CERT", "CAIRN_ETCD_KEY"]) {
        const path = byName(k)?.value ?? config[k];
        if (path === undefined) {
          out.push(`${where}: ${k} is not set (TLS to etcd with a client certificate)`);
          continue;
        }
        const m = mounts.find((v) => path.startsWith(`${v.mountPath}/`));
        const vol = arr(at(pod, "volumes")).find((v) => at(v, "name") === m?.name);
        if (at(vol, "secret", "secretName") === undefined) out.push(`${where}: ${k} (${path}) is not in a Secret volume`);
      }
    }
    const db = envOf(arr(at(pod, "containers"))[0]).find((e) => e.name === "CAIRN_DB")?.value;
    const job = roles.find((o) => o.kind === "Job" && envOf(arr(at(o, "spec", "template", "spec", "containers"))[0]).some((e) => e.name === "CAIRN_DB" && e.value === db));
    if (job === undefined) out.push(`StatefulSet ${name}: no etcd roles Job for database ${db}`);
  }
  for (const job of roles.filter((o) => o.kind === "Job")) {
    const pod = at(job, "spec", "template", "spec");
    const c = arr(at(pod, "containers"))[0];
    const where = `Job ${job.metadata?.name ?? "?"}`;
    out.push(...containerProblems(where, pod, c, []));
    const env = envOf(c);
    const value = (n: string): string | undefined => env.find((e) => e.name === n)?.value;
    if (value("CAIRN_ETCD_ENABLE_AUTH") !== "true") out.push(`${where}: does not turn etcd authentication on (CAIRN_ETCD_ENABLE_AUTH)`);
    if (!str(value("ETCDCTL_ENDPOINTS")).split(",").every((e) => e.startsWith("https://"))) out.push(`${where}: ETCDCTL_ENDPOINTS is not https only`);
    for (const k of ["ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY"]) if (value(k) === undefined) out.push(`${where}: ${k} is not set`);
    for (const k of ["ROOT_PASSWORD", "CAIRN_DB_PASSWORD"]) if (env.find((e) => e.name === k)?.valueFrom?.secretKeyRef === undefined) out.push(`${where}: ${k} is not from a Secret`);
  }
  return out;
}

/** The flags of an etcd container, as NAME -> value. */
function flags(c: Tree): Map<string, string> {
  const m = new Map<string, string>();
  for (const a of [...arr(at(c, "command")), ...arr(at(c, "args"))].map(String)) {
    const [k, ...v] = a.split("=");
    if (k!.startsWith("--")) m.set(k!.slice(2), v.join("="));
  }
  return m;
}

/** The etcd members (etcd.yaml): TLS on both sides with client certificates, non-root, fenced off. */
export function etcdProblems(objects: readonly K8sObject[]): string[] {
  const out: string[] = [];
  const set = objects.find((o) => o.kind === "StatefulSet");
  if (set === undefined) return ["no etcd StatefulSet"];
  const pod = podOf(set);
  const c = arr(at(pod, "containers"))[0];
  out.push(...containerProblems("etcd", pod, c, []));
  const f = flags(c);
  for (const k of ["listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls"]) {
    const urls = str(f.get(k)).split(",");
    if (!urls.every((u) => u.startsWith("https://"))) out.push(`etcd: --${k} is not https`);
  }
  if (!str(f.get("initial-cluster")).split(",").every((m) => m.includes("=https://"))) out.push("etcd: --initial-cluster names peers over http");
  if (f.get("client-cert-auth") !== "true") out.push("etcd: --client-cert-auth is not true");
  if (f.get("peer-client-cert-auth") !== "true") out.push("etcd: --peer-client-cert-auth is not true");
  const mounts = arr(at(c, "volumeMounts")) as { name: string; mountPath: string }[];
  for (const k of ["trusted-ca-file", "cert-file", "key-file", "peer-trusted-ca-file", "peer-cert-file", "peer-key-file"]) {
    const path = f.get(k);
    if (path === undefined) {
      out.push(`etcd: --${k} is not set`);
      continue;
    }
    const m = mounts.find((v) => path.startsWith(`${v.mountPath}/`));
    const vol = arr(at(pod, "volumes")).find((v) => at(v, "name") === m?.name);
    if (at(vol, "secret", "secretName") === undefined) out.push(`etcd: --${k} (${path}) is not in a Secret volume`);
  }
  for (const probe of ["readinessProbe", "livenessProbe"]) {
    if (at(c, probe, "httpGet", "port") !== "metrics") out.push(`etcd: the ${probe} does not use the metrics listener (the client port needs a certificate)`);
  }
  const policy = objects.find((o) => o.kind === "NetworkPolicy" && at(o, "spec", "podSelector", "matchLabels", "app") === "etcd");
  const clientRule = arr(at(policy, "spec", "ingress")).find((r) => arr(at(r, "ports")).some((p) => at(p, "port") === 2379));
  const fromOnlyPods = clientRule !== undefined && arr(at(clientRule, "from")).length > 0 && arr(at(clientRule, "from")).every((x) => at(x, "podSelector") !== undefined);
  if (!fromOnlyPods) out.push("etcd: no NetworkPolicy limits the client port to Cairn's pods");
  return out;
}

/** An HCL body as test/deploy/deploy.test.ts parses it. */
export interface HclBody {
  attrs: Record<string, unknown>;
  blocks: { type: string; labels: string[]; body: HclBody }[];
}

const blocks = (b: HclBody | undefined, type: string): HclBody[] => (b?.blocks ?? []).filter((x) => x.type === type).map((x) => x.body);

/** The Nomad job: every task non-root, read-only, without capabilities; TLS to etcd; the token. */
export function nomadProblems(job: HclBody): string[] {
  const out: string[] = [];
  for (const g of (job.blocks ?? []).filter((x) => x.type === "group")) {
    for (const task of blocks(g.body, "task")) {
      const where = `group ${g.labels[0]}`;
      const user = str(task.attrs.user);
      if (user === "" || /^(root|0)(:|$)/.test(user)) out.push(`${where}: the task runs as root (user)`);
      const config = blocks(task, "config")[0];
      if (config?.attrs.readonly_rootfs !== true) out.push(`${where}: readonly_rootfs is not true`);
      if (!arr(config?.attrs.cap_drop).map(String).includes("all")) out.push(`${where}: capabilities are not dropped (cap_drop = ["all"])`);
      if (!arr(config?.attrs.security_opt).map(String).includes("no-new-privileges")) out.push(`${where}: no-new-privileges is not set`);
      if (config?.attrs.privileged === true) out.push(`${where}: privileged`);
      const env = blocks(task, "env")[0]?.attrs ?? {};
      const endpoints = str(env.CAIRN_ETCD_ENDPOINTS).split(",");
      if (!endpoints.every((e) => e.startsWith("https://"))) out.push(`${where}: CAIRN_ETCD_ENDPOINTS is not https only`);
      for (const k of ["CAIRN_ETCD_CA", "CAIRN_ETCD_CERT", "CAIRN_ETCD_KEY"]) if (!str(env[k]).startsWith("/secrets/")) out.push(`${where}: ${k} is not a file in the task's secrets/`);
      if (!str(env.CAIRN_TOKEN_FILE).startsWith("/secrets/")) out.push(`${where}: the access token is not read from secrets/ (CAIRN_TOKEN_FILE)`);
      if (env.CAIRN_UI_TOKEN !== undefined) out.push(`${where}: the access token is written in the job`);
      if (env.CAIRN_NO_AUTH !== undefined) out.push(`${where}: CAIRN_NO_AUTH is set`);
      const templates = blocks(task, "template");
      if (!templates.some((t) => t.attrs.destination === str(env.CAIRN_TOKEN_FILE).replace(/^\//, ""))) out.push(`${where}: no template writes the token file`);
    }
  }
  return out;
}

/** The systemd unit: settings as KEY -> values (a key may repeat). */
function unitSettings(text: string): Map<string, string[]> {
  const m = new Map<string, string[]>();
  for (const line of text.split("\n")) {
    const x = /^([A-Za-z]+)=(.*)$/.exec(line.trim());
    if (x) m.set(x[1]!, [...(m.get(x[1]!) ?? []), x[2]!]);
  }
  return m;
}

/** The systemd unit: an unprivileged user, no capabilities, a read-only system, the token and TLS as credentials. */
export function systemdProblems(text: string): string[] {
  const out: string[] = [];
  const s = unitSettings(text);
  const one = (k: string): string | undefined => s.get(k)?.at(-1);
  const user = one("User");
  if (user === undefined || user === "root" || user === "0") out.push("User= is missing or root");
  if (one("NoNewPrivileges") !== "true") out.push("NoNewPrivileges= is not true");
  if (one("ProtectSystem") !== "strict") out.push("ProtectSystem= is not strict");
  if (one("CapabilityBoundingSet") !== "") out.push("CapabilityBoundingSet= does not drop every capability");
  if ((one("AmbientCapabilities") ?? "") !== "") out.push("AmbientCapabilities= grants capabilities");
  for (const k of ["PrivateTmp", "ProtectHome", "PrivateDevices"]) if (one(k) !== "true") out.push(`${k}= is not true`);
  const rw = s.get("ReadWritePaths") ?? [];
  if (rw.some((p) => p.split(/\s+/).some((x) => x === "/" || x === "/etc" || x === "/usr" || x === "/opt/cairn"))) out.push(`ReadWritePaths= opens the system: ${rw.join(" ")}`);
  const env = new Map((s.get("Environment") ?? []).map((e) => [e.slice(0, e.indexOf("=")), e.slice(e.indexOf("=") + 1)]));
  const creds = (s.get("LoadCredential") ?? []).map((c) => c.slice(0, c.indexOf(":")));
  const fromCredential = (k: string): boolean => {
    const v = env.get(k);
    return v !== undefined && v.startsWith("%d/") && creds.includes(v.slice(3));
  };
  if (!fromCredential("CAIRN_TOKEN_FILE")) out.push("the access token is not a credential (LoadCredential, CAIRN_TOKEN_FILE=%d/...)");
  for (const k of ["CAIRN_ETCD_CA", "CAIRN_ETCD_CERT", "CAIRN_ETCD_KEY"]) if (!fromCredential(k)) out.push(`${k} is not a credential (TLS to etcd)`);
  if (env.has("CAIRN_NO_AUTH")) out.push("CAIRN_NO_AUTH is set");
  return out;
}

/** The image: a non-root numeric USER last, and bubblewrap installed. */
export function dockerfileProblems(text: string): string[] {
  const out: string[] = [];
  const lines = text.split("\n").filter((l) => l.trim() !== "" && !l.trim().startsWith("#"));
  const users = lines.filter((l) => /^USER\s/.test(l)).map((l) => l.replace(/^USER\s+/, "").trim());
  const user = users.at(-1);
  if (user === undefined) out.push("no USER: the image runs as root");
  else if (!/^[1-9]\d*(:[1-9]\d*)?$/.test(user)) out.push(`USER ${user} is not a numeric non-root uid (Kubernetes' runAsNonRoot checks numbers)`);
  if (!lines.some((l) => /^RUN\s/.test(l) && /bubblewrap/.test(l) && /\/usr\/bin\/bwrap/.test(l))) out.push("bubblewrap (bwrap) is not installed");
  return out;
}
