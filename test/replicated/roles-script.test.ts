/**
 * deploy/etcd/roles.sh run with the real etcdctl the way deploy/etcd/README.md documents it
 * (ETCDCTL_* environment, root credentials, one run per database), against a dev cluster with
 * authentication and client-certificate TLS like deploy/etcd/etcd.conf.yml. Then the created user
 * opens its own database through createReplicatedStorage and is refused every other one, and no
 * password ever reached an etcdctl command line (a shim on PATH records every argv).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { makeTestCerts, type TestCerts } from "./certs.js";
import { devCluster, ev, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

const SCRIPT = fileURLToPath(new URL("../../deploy/etcd/roles.sh", import.meta.url));

/** The etcdctl on PATH, or a failure saying how to install it. */
function findEtcdctl(): string {
  const found = (process.env.PATH ?? "").split(delimiter).filter(Boolean).map((d) => join(d, "etcdctl")).find((p) => existsSync(p));
  if (!found) throw new Error("etcdctl is not installed: this test runs deploy/etcd/roles.sh with it. Install it with `apt-get install -y etcd-client` (Debian).");
  return found;
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

describe("deploy/etcd/roles.sh with etcdctl", () => {
  let certs: TestCerts;
  let dc: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("roles-sh");
  const argvLog = join(dirs.dir, "etcdctl-argv.log");
  const storages: Storage[] = [];
  const passwords = { h1: "h1-Pw-4d1f-secret", h2: "h2-Pw-88ab-secret", h1Again: "h1-other-Pw-0c3e" };

  /** Runs roles.sh with only the documented environment (plus PATH with the recording shim first). */
  const runScript = (env: Record<string, string>): Promise<Run> =>
    new Promise((resolve) => {
      const base = {
        PATH: `${join(dirs.dir, "bin")}${delimiter}${process.env.PATH ?? ""}`,
        ETCDCTL_ENDPOINTS: dc.cluster.endpoints.join(","),
        ETCDCTL_CACERT: certs.ca,
        ETCDCTL_CERT: certs.clientCert,
        ETCDCTL_KEY: certs.clientKey,
        ETCDCTL_USER: `root:${dc.cluster.root!.password}`,
        // etcdctl's own 5 s command deadline runs out on a loaded machine (bcrypt auth per call).
        ETCDCTL_COMMAND_TIMEOUT: "60s",
        ETCDCTL_DIAL_TIMEOUT: "30s",
      };
      execFile("sh", [SCRIPT], { env: { ...base, ...env }, timeout: 240_000 }, (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : -1) : 0;
        resolve({ code, stdout, stderr });
      });
    });
  const harness = (user: string, password: string, sub: string): Storage => {
    const s = createReplicatedStorage({
      endpoints: dc.cluster.endpoints,
      dataDir: `${dirs.dir}/${sub}`,
      username: user,
      password,
      tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey },
      commitTimeoutMs: 3000,
    });
    storages.push(s);
    return s;
  };
  const refusedFor = (user: string, db: string, password: string) => (err: unknown) => {
    assert.equal((err as { code?: string }).code, "config", String(err));
    const msg = (err as Error).message;
    assert.match(msg, new RegExp(`etcd user "${user}" may not open database "${db}"`));
    assert.ok(msg.includes(`cairn/db/${db}/`), msg);
    assert.ok(!msg.includes(password), "the password is not in the message");
    return true;
  };

  before(async () => {
    const etcdctl = findEtcdctl();
    // A shim that records each etcdctl argv, then runs the real one.
    const bin = join(dirs.dir, "bin");
    mkdirSync(bin, { recursive: true });
    writeFileSync(join(bin, "etcdctl"), `#!/bin/sh\nprintf '%s\\n' "$*" >> '${argvLog}'\nexec '${etcdctl}' "$@"\n`);
    chmodSync(join(bin, "etcdctl"), 0o755);
    certs = makeTestCerts();
    dc = await devCluster({ auth: true, tls: { ca: certs.ca, cert: certs.serverCert, key: certs.serverKey } });
  });
  after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    certs?.remove();
    dirs.remove();
  });

  it("creates the role cairn-db-<db> on exactly the prefix cairn/db/<db>/ and the user, for two harnesses", async () => {
    const r1 = await runScript({ CAIRN_DB: "harness-1", CAIRN_DB_USER: "harness-1", CAIRN_DB_PASSWORD: passwords.h1 });
    assert.equal(r1.code, 0, r1.stderr);
    assert.match(r1.stdout, /Role cairn-db-harness-1/);
    assert.match(r1.stdout, /KV Write:\s+\[cairn\/db\/harness-1\/, cairn\/db\/harness-10\) \(prefix cairn\/db\/harness-1\/\)/);
    assert.match(r1.stdout, /User harness-1 created/);
    const r2 = await runScript({ CAIRN_DB: "harness-2", CAIRN_DB_USER: "harness-2", CAIRN_DB_PASSWORD: passwords.h2 });
    assert.equal(r2.code, 0, r2.stderr);
  });

  it("the user opens, commits to and reads its own database", async () => {
    const db = await harness("harness-1", passwords.h1, "h1").open("harness-1");
    assert.deepEqual(await db.commit([ev("one"), ev("two")]), { firstSeq: 1, lastSeq: 2 });
    assert.deepEqual((await db.read()).map((e) => e.identity), ["one", "two"]);
    await db.close();
    const other = await harness("harness-2", passwords.h2, "h2").open("harness-2");
    await other.commit([ev("x")]);
    await other.close();
  });

  it("the user is refused another harness's database, and a name that merely extends its own, with a clear ConfigError", async () => {
    const s = harness("harness-1", passwords.h1, "h1-other");
    await assert.rejects(s.open("harness-2"), refusedFor("harness-1", "harness-2", passwords.h1));
    // cairn/db/harness-10/ is outside cairn/db/harness-1/: the trailing slash of the prefix matters.
    await assert.rejects(s.open("harness-10"), refusedFor("harness-1", "harness-10", passwords.h1));
    // harness-2's data is intact and its own user still owns it.
    const reader = await harness("harness-2", passwords.h2, "h2-read").reader("harness-2");
    assert.deepEqual((await reader.read()).map((e) => e.identity), ["x"]);
    await reader.close();
  });

  it("running it again for the same database succeeds and keeps the user's password", async () => {
    const again = await runScript({ CAIRN_DB: "harness-1", CAIRN_DB_USER: "harness-1", CAIRN_DB_PASSWORD: passwords.h1Again });
    assert.equal(again.code, 0, again.stderr);
    assert.doesNotMatch(again.stdout, /User harness-1 created/);
    const db = await harness("harness-1", passwords.h1, "h1-again").open("harness-1");
    assert.equal(await db.head(), 2);
    await db.close();
  });

  it("a wrong root password or an invalid database name stops the script with a non-zero exit", async () => {
    const wrongRoot = await runScript({ ETCDCTL_USER: "root:not-the-root-pw", CAIRN_DB: "harness-3", CAIRN_DB_USER: "harness-3", CAIRN_DB_PASSWORD: "pw-3" });
    assert.notEqual(wrongRoot.code, 0);
    assert.match(wrongRoot.stderr, /authentication failed/);
    const badName = await runScript({ CAIRN_DB: "a/b", CAIRN_DB_USER: "u", CAIRN_DB_PASSWORD: "p" });
    assert.equal(badName.code, 2);
    assert.match(badName.stderr, /is not a database name/);
  });

  it("no harness password ever appeared on an etcdctl command line", () => {
    const lines = readFileSync(argvLog, "utf8").trim().split("\n");
    assert.ok(lines.some((l) => l.startsWith("user add harness-1")), lines.join("\n"));
    for (const line of lines) for (const pw of Object.values(passwords)) assert.ok(!line.includes(pw), line);
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/roles-script.test.ts");
