/**
 * The replicated adapter over client TLS with client-certificate auth, on a real three-member dev
 * cluster whose certificates are made by openssl for this run: the options and the CAIRN_ETCD_CA /
 * CERT / KEY environment variables both open, commit and read; a missing client certificate, one
 * from another CA, and an unverifiable server each fail fast with a ConfigError naming the setting
 * to fix, and no key material reaches the logs.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage, type ReplicatedOptions } from "../../storage-adapters/replicated/index.js";
import { makeTestCerts, type TestCerts } from "./certs.js";
import { captureLogger, devCluster, ev, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

/** Each refusal must come back well within this (a hang fails the test instead of the file timing out). */
const REFUSAL_TIMEOUT_MS = 20_000;

describe("replicated adapter over TLS with client certificates", () => {
  let certs: TestCerts;
  let dc: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("tls");
  const storages: Storage[] = [];
  const logger = captureLogger();
  const make = (options: Omit<ReplicatedOptions, "dataDir" | "logger">, sub: string): Storage => {
    const s = createReplicatedStorage({ dataDir: `${dirs.dir}/${sub}`, logger, healthIntervalMs: 300, commitTimeoutMs: 3000, ...options });
    storages.push(s);
    return s;
  };
  const isConfigError = (pattern: RegExp) => (err: unknown) => {
    assert.equal((err as { code?: string }).code, "config", String(err));
    assert.match((err as Error).message, pattern);
    return true;
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

  it("the dev cluster serves https client URLs", () => {
    assert.equal(dc.cluster.endpoints.length, 3);
    for (const url of dc.cluster.endpoints) assert.match(url, /^https:\/\/127\.0\.0\.1:\d+$/);
  });

  it("tls options (ca, cert, key) open, commit and read; a fresh storage reads the commit back", async () => {
    const tls = { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey };
    const db = await make({ endpoints: dc.cluster.endpoints, tls }, "opts").open("alpha");
    assert.deepEqual(await db.commit([ev("a1"), ev("a2")]), { firstSeq: 1, lastSeq: 2 });
    assert.deepEqual((await db.read()).map((e) => e.identity), ["a1", "a2"]);
    await db.close();
    const reader = await make({ endpoints: dc.cluster.endpoints, tls }, "opts-reader").reader("alpha");
    assert.deepEqual((await reader.read()).map((e) => e.identity), ["a1", "a2"]);
    await reader.close();
  });

  it("CAIRN_ETCD_ENDPOINTS / CA / CERT / KEY from the environment do the same", async () => {
    const keys = ["CAIRN_ETCD_ENDPOINTS", "CAIRN_ETCD_CA", "CAIRN_ETCD_CERT", "CAIRN_ETCD_KEY"] as const;
    const saved = keys.map((k) => process.env[k]);
    try {
      process.env.CAIRN_ETCD_ENDPOINTS = dc.cluster.endpoints.join(",");
      process.env.CAIRN_ETCD_CA = certs.ca;
      process.env.CAIRN_ETCD_CERT = certs.clientCert;
      process.env.CAIRN_ETCD_KEY = certs.clientKey;
      const s = make({}, "env");
      const db = await s.open("from-env");
      assert.deepEqual(await db.commit([ev("e1")]), { firstSeq: 1, lastSeq: 1 });
      assert.deepEqual((await db.read()).map((e) => e.identity), ["e1"]);
      await db.close();
      // The environment's CA alone (no client certificate) is refused: the env cert and key were what let us in.
      delete process.env.CAIRN_ETCD_CERT;
      delete process.env.CAIRN_ETCD_KEY;
      await assert.rejects(make({}, "env-nocert").open("from-env"), isConfigError(/CAIRN_ETCD_CERT/));
    } finally {
      keys.forEach((k, i) => {
        if (saved[i] === undefined) delete process.env[k];
        else process.env[k] = saved[i];
      });
    }
  });

  it("without a client certificate open fails with a ConfigError naming tls.cert / tls.key", { timeout: REFUSAL_TIMEOUT_MS }, async () => {
    const s = make({ endpoints: dc.cluster.endpoints, tls: { ca: certs.ca } }, "nocert");
    await assert.rejects(s.open("alpha"), isConfigError(/TLS handshake .*refused our client certificate or got none.*tls\.cert and tls\.key \(or CAIRN_ETCD_CERT \/ CAIRN_ETCD_KEY\)/));
    await assert.rejects(s.reader("alpha"), isConfigError(/tls\.cert/));
  });

  it("a client certificate from another CA is refused the same way", { timeout: REFUSAL_TIMEOUT_MS }, async () => {
    const s = make({ endpoints: dc.cluster.endpoints, tls: { ca: certs.ca, cert: certs.otherClientCert, key: certs.otherClientKey } }, "othercert");
    await assert.rejects(s.open("alpha"), isConfigError(/refused our client certificate.*signed by the CA the members trust/));
  });

  it("a CA that did not sign the members' certificate fails with a ConfigError naming tls.ca", { timeout: REFUSAL_TIMEOUT_MS }, async () => {
    const s = make({ endpoints: dc.cluster.endpoints, tls: { ca: certs.otherCa, cert: certs.clientCert, key: certs.clientKey } }, "otherca");
    await assert.rejects(s.open("alpha"), isConfigError(/certificate could not be verified; set tls\.ca \(or CAIRN_ETCD_CA\)/));
  });

  it("an unreadable TLS file is a ConfigError at creation naming the option and the path", () => {
    const missing = `${certs.dir}/no-such-ca.crt`;
    assert.throws(
      () => createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/missing`, tls: { ca: missing } }),
      isConfigError(/"tls\.ca" \(or CAIRN_ETCD_CA\): cannot read .*no-such-ca\.crt \(ENOENT\)/),
    );
  });

  it("no key or certificate material appears in the logs", () => {
    assert.ok(logger.lines.length > 0, "the adapter logged something");
    const keyBody = readFileSync(certs.clientKey, "utf8").split("\n")[1]!;
    for (const line of logger.lines) {
      assert.ok(!line.includes("PRIVATE KEY"), line);
      assert.ok(!line.includes(keyBody), line);
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/tls.test.ts");
