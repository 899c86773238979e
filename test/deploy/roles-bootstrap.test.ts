/**
 * deploy/etcd/roles.sh as the Kubernetes roles Job runs it (deploy/kubernetes/etcd-roles.yaml:
 * CAIRN_ETCD_ENABLE_AUTH=true) against a new etcd cluster with client-certificate TLS and
 * authentication still off, with the real etcdctl: the first run turns authentication on (root with
 * the given password) and creates the database's role and user; after it, a client with a valid
 * certificate but no password can do nothing, the database's user opens its own database and is
 * refused another; a second run for another database changes nothing else.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { makeTestCerts, type TestCerts } from "../replicated/certs.js";
import { devCluster, ev, tempDir } from "../replicated/helpers.js";
import { exitAfterTests } from "../support/exit.js";

const SCRIPT = fileURLToPath(new URL("../../deploy/etcd/roles.sh", import.meta.url));
const etcdctl = (process.env.PATH ?? "").split(delimiter).map((d) => join(d, "etcdctl")).find((p) => existsSync(p));
if (etcdctl === undefined) throw new Error("etcdctl is not installed: this test runs deploy/etcd/roles.sh with it (Debian: apt-get install -y etcd-client).");

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function run(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((resolve) =>
    execFile(file, args, { env, timeout: 240_000 }, (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === "number" ? err.code : -1) : 0, stdout, stderr })),
  );
}

describe("roles.sh with CAIRN_ETCD_ENABLE_AUTH=true on a new cluster", () => {
  let certs: TestCerts;
  let dc: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("roles-bootstrap");
  const storages: Storage[] = [];
  const ROOT = "root-Pw-7c1e-bootstrap";
  const H1 = "h1-Pw-2b9d-bootstrap";

  const base = (): NodeJS.ProcessEnv => ({
    PATH: process.env.PATH,
    ETCDCTL_API: "3",
    ETCDCTL_ENDPOINTS: dc.cluster.endpoints.join(","),
    ETCDCTL_CACERT: certs.ca,
    ETCDCTL_CERT: certs.clientCert,
    ETCDCTL_KEY: certs.clientKey,
    ETCDCTL_COMMAND_TIMEOUT: "60s",
    ETCDCTL_DIAL_TIMEOUT: "30s",
  });
  const roles = (env: NodeJS.ProcessEnv): Promise<Run> => run("sh", [SCRIPT], { ...base(), ETCDCTL_USER: `root:${ROOT}`, CAIRN_ETCD_ENABLE_AUTH: "true", ...env });
  const storage = (user: string, password: string, sub: string): Storage => {
    const s = createReplicatedStorage({
      endpoints: dc.cluster.endpoints,
      dataDir: join(dirs.dir, sub),
      username: user,
      password,
      tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey },
      // A deadline per request, not a speed expectation: bcrypt per authentication is slow on a loaded machine.
      commitTimeoutMs: 30_000,
    });
    storages.push(s);
    return s;
  };

  before(async () => {
    certs = makeTestCerts();
    dc = await devCluster({ tls: { ca: certs.ca, cert: certs.serverCert, key: certs.serverKey } });
  });
  after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    certs?.remove();
    dirs.remove();
  });

  it("before: any client with a certificate may do anything (authentication is off)", async () => {
    const list = await run(etcdctl!, ["user", "list"], base());
    assert.equal(list.code, 0, list.stderr);
  });

  it("turns authentication on and creates the database's role and user", async () => {
    const r = await roles({ CAIRN_DB: "harness-1", CAIRN_DB_USER: "harness-1", CAIRN_DB_PASSWORD: H1 });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /Authentication Enabled/);
    assert.match(r.stdout, /User harness-1 created/);
    // A valid certificate without a password is now no one (its CN is not a user).
    const anonymous = await run(etcdctl!, ["user", "list"], base());
    assert.notEqual(anonymous.code, 0, anonymous.stdout);
    const put = await run(etcdctl!, ["put", "cairn/db/harness-1/epoch", "99"], base());
    assert.notEqual(put.code, 0, "an anonymous client cannot write a database's keys");
    const asRoot = await run(etcdctl!, ["user", "list"], { ...base(), ETCDCTL_USER: `root:${ROOT}` });
    assert.equal(asRoot.code, 0, asRoot.stderr);
  });

  it("the database's user opens its own database and is refused another", async () => {
    const db = await storage("harness-1", H1, "h1").open("harness-1");
    assert.deepEqual(await db.commit([ev("one")]), { firstSeq: 1, lastSeq: 1 });
    await db.close();
    await assert.rejects(storage("harness-1", H1, "h1-other").open("harness-2"), (err: unknown) => (err as { code?: string }).code === "config");
  });

  it("a second run (another database) finds authentication on and changes nothing else", async () => {
    const r = await roles({ CAIRN_DB: "harness-2", CAIRN_DB_USER: "harness-2", CAIRN_DB_PASSWORD: "h2-Pw-5e0a-bootstrap" });
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /Authentication Enabled/);
    const db = await storage("harness-1", H1, "h1-again").open("harness-1");
    assert.equal(await db.head(), 1);
    await db.close();
  });

  it("asked to turn authentication on without root's password, it refuses", async () => {
    const r = await run("sh", [SCRIPT], { ...base(), CAIRN_ETCD_ENABLE_AUTH: "true", CAIRN_DB: "harness-3", CAIRN_DB_USER: "harness-3", CAIRN_DB_PASSWORD: "p" });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /needs ETCDCTL_USER=root:PASSWORD/);
  });
});

exitAfterTests("test/deploy/roles-bootstrap.test.ts");
