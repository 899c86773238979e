import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { request } from "node:http";
import { Metrics } from "../../src/observability/metrics.js";
import { parseListen, startObservabilityServer, type Readiness } from "../../src/observability/server.js";
import { hasCode } from "../../src/errors.js";
import { parseExposition, valueOf } from "./exposition.js";

test("/metrics, /healthz, /readyz (flipping to 503), 404 and 405", async () => {
  const metrics = new Metrics({ adapter: "sqlite" });
  let readiness: Readiness = { ready: true, reason: "owner of db prod at epoch 4" };
  const server = await startObservabilityServer({ listen: "127.0.0.1:0", metrics, ready: () => readiness });
  try {
    assert.ok(server.port > 0);
    assert.equal(server.url, `http://127.0.0.1:${server.port}`);

    metrics.commit("sqlite", "ok", 0.002, 2);
    const res = await fetch(`${server.url}/metrics`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), metrics.registry.contentType);
    const samples = parseExposition(await res.text());
    assert.equal(valueOf(samples, "cairn_storage_commits_total", { adapter: "sqlite", outcome: "ok" }), 1);
    assert.ok(valueOf(samples, "process_cpu_user_seconds_total") !== undefined);

    const health = await fetch(`${server.url}/healthz`);
    assert.equal(health.status, 200);
    assert.equal((await health.text()).trim(), "ok");

    const ready = await fetch(`${server.url}/readyz`);
    assert.equal(ready.status, 200);
    assert.match(await ready.text(), /owner of db prod/);

    readiness = { ready: false, reason: "fenced by a newer opener (epoch 5)" };
    const notReady = await fetch(`${server.url}/readyz`);
    assert.equal(notReady.status, 503);
    assert.equal((await notReady.text()).trim(), "fenced by a newer opener (epoch 5)");
    const stillHealthy = await fetch(`${server.url}/healthz`);
    assert.equal(stillHealthy.status, 200, "liveness does not follow readiness");
    await stillHealthy.text();

    const missing = await fetch(`${server.url}/nope`);
    assert.equal(missing.status, 404);
    await missing.text();
    const post = await fetch(`${server.url}/metrics`, { method: "POST" });
    assert.equal(post.status, 405);
    await post.text();
  } finally {
    await server.close();
  }
  await assert.rejects(fetch(`${server.url}/healthz`), "closed server refuses connections");
  await server.close(); // idempotent
});

test("a throwing ready() is served as 503 with its message", async () => {
  const server = await startObservabilityServer({
    listen: "127.0.0.1:0",
    metrics: new Metrics({ defaultMetrics: false }),
    ready: () => {
      throw new Error("harness not started");
    },
  });
  try {
    const res = await fetch(`${server.url}/readyz`);
    assert.equal(res.status, 503);
    assert.match(await res.text(), /harness not started/);
  } finally {
    await server.close();
  }
});

test("close() returns even with a keep-alive scraper connected", async () => {
  const server = await startObservabilityServer({ listen: "127.0.0.1:0", metrics: new Metrics({ defaultMetrics: false }), ready: () => ({ ready: true, reason: "ok" }) });
  try {
    const res = await fetch(`${server.url}/metrics`, { headers: { connection: "keep-alive" } });
    await res.text();
  } finally {
    await server.close();
  }
  await assert.rejects(fetch(`${server.url}/metrics`));
});

test("a port in use rejects with the socket error", async () => {
  const blocker = createServer();
  await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve));
  try {
    const port = (blocker.address() as { port: number }).port;
    await assert.rejects(
      startObservabilityServer({ listen: `127.0.0.1:${port}`, metrics: new Metrics({ defaultMetrics: false }), ready: () => ({ ready: true, reason: "" }) }),
      (err: unknown) => (err as NodeJS.ErrnoException).code === "EADDRINUSE",
    );
  } finally {
    await new Promise<void>((resolve) => blocker.close(() => resolve()));
  }
});

test("listen strings: valid forms parse, bad ones fail with a sentence naming --listen", async () => {
  assert.deepEqual(parseListen("0.0.0.0:9464"), { host: "0.0.0.0", port: 9464 });
  assert.deepEqual(parseListen("localhost:0"), { host: "localhost", port: 0 });
  assert.deepEqual(parseListen("[::1]:9464"), { host: "::1", port: 9464 });
  for (const bad of ["9464", ":9464", "0.0.0.0:", "host:70000", "host:-1", "host:http", "::1:9464", "a b:1", ""]) {
    assert.throws(
      () => parseListen(bad),
      (err: unknown) => hasCode(err, "config") && (err as Error).message.startsWith(`--listen expects HOST:PORT`) && (err as Error).message.includes(JSON.stringify(bad)),
      bad,
    );
  }
  await assert.rejects(
    startObservabilityServer({ listen: "nonsense", metrics: new Metrics({ defaultMetrics: false }), ready: () => ({ ready: true, reason: "" }) }),
    /--listen expects HOST:PORT.*got "nonsense"/,
  );
});

test("by default the endpoint answers only to loopback names with its port; the probes answer any Host", async () => {
  const server = await startObservabilityServer({ listen: "127.0.0.1:0", metrics: new Metrics({ defaultMetrics: false }), ready: () => ({ ready: true, reason: "ok" }) });
  const get = (path: string, host: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port: server.port, path, headers: { host }, setHost: false }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on("error", reject);
      req.end();
    });
  try {
    assert.equal(await get("/metrics", `localhost:${server.port}`), 200);
    assert.equal(await get("/metrics", `127.0.0.1:${server.port}`), 200);
    assert.equal(await get("/metrics", `rebound.example:${server.port}`), 421);
    assert.equal(await get("/readyz", `rebound.example:${server.port}`), 200);
  } finally {
    await server.close();
  }
});
