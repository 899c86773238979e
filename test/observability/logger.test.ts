import { test } from "node:test";
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { LOG_LEVELS, bindLogger, createLogger, parseLogLevel } from "../../src/observability/logger.js";
import { REDACTED, isSecretKey } from "../../src/observability/redact.js";
import { hasCode } from "../../src/errors.js";

/** A destination that keeps everything written to it. */
function capture(): { stream: Writable; text: () => string; records: () => Record<string, unknown>[] } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer | string, _enc, cb) {
      chunks.push(chunk.toString());
      cb();
    },
  });
  const text = (): string => chunks.join("");
  const records = (): Record<string, unknown>[] =>
    text()
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { stream, text, records };
}

const SECRETS = ["hunter2-pw", "sk-live-apikey-123", "Bearer abc.def.ghi", "tok-987", "aws-key-555", "db-secret-777", "env-secret-999", "child-key-000", "base-token-111", "deep-password-222"];

test("credentials never reach the output, at any depth, in records, bindings and base", () => {
  process.env.CAIRN_TEST_SECRET = "env-secret-999";
  const out = capture();
  const logger = createLogger({ pretty: false, destination: out.stream, base: { service: "cairn", token: "base-token-111" } });
  const child = logger.child({ apiKey: "child-key-000" });
  const record = {
    password: "hunter2-pw",
    provider: { apiKey: "sk-live-apikey-123", model: "claude" },
    headers: { authorization: "Bearer abc.def.ghi", accept: "json" },
    api_key: "sk-live-apikey-123",
    token: "tok-987",
    aws: { key: "aws-key-555" },
    config: { storage: { etcd: { auth: { password: "deep-password-222" } } }, db_secret: "db-secret-777" },
    env: { HOME: "/root", CAIRN_TEST_SECRET: "env-secret-999" },
    spawn: { options: { environment: process.env } },
    raw: process.env,
    tokens: 42,
  };
  const before = JSON.stringify(record.provider);
  child.info(record, "calling the provider");
  const text = out.text();
  for (const secret of SECRETS) assert.ok(!text.includes(secret), `secret ${secret} leaked: ${text}`);
  const [line] = out.records();
  assert.ok(line !== undefined);
  assert.equal(line.password, REDACTED);
  assert.deepEqual(line.provider, { apiKey: REDACTED, model: "claude" });
  assert.deepEqual(line.headers, { authorization: REDACTED, accept: "json" });
  assert.equal(line.env, REDACTED);
  assert.equal(line.raw, REDACTED);
  assert.equal(line.apiKey, REDACTED);
  assert.equal(line.token, REDACTED);
  assert.equal(line.service, "cairn");
  assert.equal(line.tokens, 42, "a token count is not a credential");
  assert.equal(line.msg, "calling the provider");
  assert.equal(JSON.stringify(record.provider), before, "the caller's object is not mutated");
  delete process.env.CAIRN_TEST_SECRET;
});

test("pretty output redacts too", () => {
  const out = capture();
  const logger = createLogger({ pretty: true, destination: out.stream });
  logger.warn({ password: "hunter2-pw", headers: { authorization: "Bearer abc.def.ghi" } }, "pretty line");
  const text = out.text();
  assert.match(text, /pretty line/);
  assert.ok(!text.includes("hunter2-pw") && !text.includes("abc.def.ghi"), text);
  assert.throws(() => JSON.parse(text.trim()), "pretty output is not JSON");
});

test("errors keep pino's serializer (type, message, stack)", () => {
  const out = capture();
  createLogger({ pretty: false, destination: out.stream }).error({ err: new TypeError("boom") }, "failed");
  const err = out.records()[0]?.err as Record<string, unknown>;
  assert.equal(err.type, "TypeError");
  assert.equal(err.message, "boom");
  assert.match(String(err.stack), /TypeError: boom/);
});

test("bindLogger puts db, session, cell, epoch and host on every record, leaving the parent alone", () => {
  const out = capture();
  const logger = createLogger({ pretty: false, destination: out.stream });
  const bound = bindLogger(logger, { db: "prod", session: "s-1", cell: 4, epoch: 9, host: "worker-a" });
  bound.info({ seq: 10 }, "committed");
  logger.info("parent");
  const [first, second] = out.records();
  assert.ok(first !== undefined && second !== undefined);
  assert.deepEqual(
    { db: first.db, session: first.session, cell: first.cell, epoch: first.epoch, host: first.host, seq: first.seq, level: first.level },
    { db: "prod", session: "s-1", cell: 4, epoch: 9, host: "worker-a", seq: 10, level: "info" },
  );
  assert.equal(second.db, undefined);
  assert.equal(typeof first.time, "string", "ISO time");
});

test("bindLogger leaves out undefined fields", () => {
  const out = capture();
  bindLogger(createLogger({ pretty: false, destination: out.stream }), { db: "x", session: undefined }).info("hi");
  const [line] = out.records();
  assert.ok(line !== undefined && line.db === "x" && !("session" in line));
});

test("level filtering: below the level is dropped, at or above is written", () => {
  const out = capture();
  const logger = createLogger({ level: "warn", pretty: false, destination: out.stream });
  logger.debug("d");
  logger.info("i");
  logger.warn("w");
  logger.error("e");
  assert.deepEqual(out.records().map((r) => [r.level, r.msg]), [["warn", "w"], ["error", "e"]]);
  const silent = capture();
  createLogger({ level: "silent", pretty: false, destination: silent.stream }).fatal("nothing");
  assert.equal(silent.text(), "");
});

test("--log-level values are validated with a sentence naming the flag", () => {
  for (const level of LOG_LEVELS) assert.equal(parseLogLevel(level), level);
  assert.equal(parseLogLevel("DEBUG"), "debug");
  for (const bad of ["verbose", "", "warning", "10"]) {
    assert.throws(
      () => parseLogLevel(bad),
      (err: unknown) => hasCode(err, "config") && /--log-level expects one of fatal, error, warn, info, debug, trace, silent/.test((err as Error).message),
    );
  }
  assert.throws(() => createLogger({ level: "loud", pretty: false }), /--log-level/);
});

test("isSecretKey: credential names match in any case and separator style; ordinary names do not", () => {
  for (const k of ["password", "Password", "db_password", "apiKey", "API_KEY", "api-key", "authorization", "Authorization", "token", "accessToken", "refresh_token", "key", "clientSecret", "cookie", "env"]) {
    assert.ok(isSecretKey(k), k);
  }
  for (const k of ["tokens", "input_tokens", "keyboard", "session", "cell", "model", "monkey_count", "message"]) assert.ok(!isSecretKey(k), k);
});

test("by default, JSON lines go to stderr (not a terminal here), nothing to stdout, and nothing is lost at exit", async () => {
  const { execFile } = await import("node:child_process");
  const { fileURLToPath } = await import("node:url");
  const module = fileURLToPath(new URL("../../src/observability/logger.ts", import.meta.url));
  const script = `import { createLogger } from ${JSON.stringify(module)}; createLogger().info({ password: "hunter2-pw", n: 1 }, "last words"); process.exit(0);`;
  const { stdout, stderr } = await new Promise<{ stdout: string; stderr: string }>((resolve, reject) => {
    execFile(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { timeout: 30_000 }, (err, stdout, stderr) => (err ? reject(err) : resolve({ stdout, stderr })));
  });
  assert.equal(stdout, "");
  const line = JSON.parse(stderr.trim()) as Record<string, unknown>;
  assert.equal(line.msg, "last words");
  assert.equal(line.password, REDACTED);
  assert.equal(line.n, 1);
});
