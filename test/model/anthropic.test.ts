/**
 * The Anthropic provider against a local server speaking the Messages API (non-streaming JSON, which
 * is what the provider sends: `stream` is absent from its request).
 */
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";
import { ModelError, type ModelRequest } from "../../src/model/contract.js";
import { SYSTEM_PROMPT, STEP_TOOL } from "../../src/model/prompt.js";
import { createModel } from "../../src/model/providers.js";
import { initialState } from "../../src/state/schema.js";
import { startFakeServer, type FakeServer } from "./fake-server.js";

const KEY = "sk-ant-test-SECRET-0123456789";
const PATCH = [
  { op: "test", path: "/revision", value: 0 },
  { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "note", text: "plan" } },
];

function message(content: unknown[], stop_reason = "tool_use", usage: unknown = { input_tokens: 1200, output_tokens: 85 }) {
  return { id: "msg_1", type: "message", role: "assistant", model: "claude-test", content, stop_reason, stop_sequence: null, usage };
}
function toolUse(input: unknown, name = "step", id = "toolu_1") {
  return { type: "tool_use", id, name, input };
}

const request: ModelRequest = { state: initialState("s1", "make the calculator tests pass"), turn: "s1:t1", attempt: 1 };

async function failure(p: Promise<unknown>): Promise<ModelError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof ModelError, `expected a ModelError, got ${String(err)}`);
    assert.equal(err.code, "model");
    return err;
  }
  assert.fail("expected the call to fail");
}

describe("anthropic provider", () => {
  let server: FakeServer;
  before(async () => {
    server = await startFakeServer();
  });
  after(async () => {
    await server.close();
  });
  beforeEach(() => {
    server.requests.length = 0;
  });
  const model = () => createModel("anthropic/claude-test", { env: { ANTHROPIC_API_KEY: KEY, ANTHROPIC_BASE_URL: server.url }, maxTokens: 4096 });

  test("a good tool call returns the patch and usage; the request carries the prompt, the tool and the State", async () => {
    server.reply({ kind: "json", status: 200, body: message([{ type: "text", text: "Planning." }, toolUse({ patch: PATCH })]) });
    const m = model();
    assert.equal(m.name, "anthropic/claude-test");
    const reply = await m.step({ ...request, rejection: { code: "revision", reason: "the first op must test /revision 0", patch: [{ op: "add" }] } });
    assert.deepEqual(reply.patch, PATCH);
    assert.deepEqual(reply.usage, { input_tokens: 1200, output_tokens: 85 });

    assert.equal(server.requests.length, 1);
    const req = server.requests[0]!;
    assert.equal(req.method, "POST");
    assert.equal(req.url, "/v1/messages");
    assert.equal(req.headers["x-api-key"], KEY);
    const body = req.body as Record<string, unknown>;
    assert.equal(body.model, "claude-test");
    assert.equal(body.max_tokens, 4096);
    assert.equal(body.stream, undefined);
    assert.equal(body.system, SYSTEM_PROMPT);
    assert.deepEqual(body.tools, [{ name: "step", description: STEP_TOOL.description, input_schema: STEP_TOOL.parameters }]);
    assert.deepEqual(body.tool_choice, { type: "tool", name: "step", disable_parallel_tool_use: true });
    const messages = body.messages as { role: string; content: string }[];
    assert.equal(messages.length, 1);
    assert.equal(messages[0]!.role, "user");
    assert.ok(messages[0]!.content.includes(JSON.stringify(request.state)), "the user message holds the State");
    assert.ok(messages[0]!.content.includes("the first op must test /revision 0"), "the user message holds the rejection");
  });

  test("cache tokens count as input", async () => {
    server.reply({
      kind: "json",
      status: 200,
      body: message([toolUse({ patch: PATCH })], "tool_use", { input_tokens: 10, output_tokens: 5, cache_creation_input_tokens: 100, cache_read_input_tokens: 1000 }),
    });
    const reply = await model().step(request);
    assert.deepEqual(reply.usage, { input_tokens: 1110, output_tokens: 5 });
  });

  test("a 5xx is a retryable http error", async () => {
    server.reply({ kind: "json", status: 529, body: { type: "error", error: { type: "overloaded_error", message: "Overloaded" } } });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "http");
    assert.equal(err.retryable, true);
    assert.equal(err.status, 529);
    assert.equal(server.requests.length, 1, "the SDK does not retry on its own");
  });

  test("a 429 is retryable, a 400 is not, a 404 is a config error", async () => {
    server.reply({ kind: "json", status: 429, body: { type: "error", error: { type: "rate_limit_error", message: "slow down" } } });
    const e429 = await failure(model().step(request));
    assert.deepEqual([e429.kind, e429.retryable], ["http", true]);
    server.reply({ kind: "json", status: 400, body: { type: "error", error: { type: "invalid_request_error", message: "bad" } } });
    const e400 = await failure(model().step(request));
    assert.deepEqual([e400.kind, e400.retryable], ["http", false]);
    server.reply({ kind: "json", status: 404, body: { type: "error", error: { type: "not_found_error", message: "model: claude-test" } } });
    const e404 = await failure(model().step(request));
    assert.deepEqual([e404.kind, e404.retryable], ["config", false]);
  });

  test("a 401 is not retryable and the key is not in the message", async () => {
    server.reply({ kind: "json", status: 401, body: { type: "error", error: { type: "authentication_error", message: `invalid x-api-key ${KEY}` } } });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "auth");
    assert.equal(err.retryable, false);
    assert.equal(err.status, 401);
    assert.ok(!err.message.includes(KEY), err.message);
    assert.ok(!JSON.stringify(err).includes(KEY));
  });

  test("a tool call cut off at max_tokens is bad_arguments, retryable, with usage", async () => {
    server.reply({ kind: "json", status: 200, body: message([toolUse({ patch: [{ op: "test", path: "/revision" }] })], "max_tokens") });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "bad_arguments");
    assert.equal(err.retryable, true);
    assert.deepEqual(err.usage, { input_tokens: 1200, output_tokens: 85 });
  });

  test("arguments without a patch are bad_arguments", async () => {
    server.reply({ kind: "json", status: 200, body: message([toolUse({ ops: PATCH })]) });
    const err = await failure(model().step(request));
    assert.deepEqual([err.kind, err.retryable], ["bad_arguments", true]);
  });

  test("no tool call is retryable no_tool_call, with usage", async () => {
    server.reply({ kind: "json", status: 200, body: message([{ type: "text", text: "I think we are done." }], "end_turn") });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "no_tool_call");
    assert.equal(err.retryable, true);
    assert.deepEqual(err.usage, { input_tokens: 1200, output_tokens: 85 });
  });

  test("two tool calls are retryable multiple_tool_calls", async () => {
    server.reply({ kind: "json", status: 200, body: message([toolUse({ patch: PATCH }, "step", "a"), toolUse({ patch: PATCH }, "step", "b")]) });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "multiple_tool_calls");
    assert.equal(err.retryable, true);
  });

  test("a reset connection is a retryable transport error", async () => {
    server.reply({ kind: "reset" });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "transport");
    assert.equal(err.retryable, true);
  });

  test("a timeout and an abort are retryable transport errors", async () => {
    server.reply({ kind: "hang" });
    const slow = createModel("anthropic/claude-test", { env: { ANTHROPIC_API_KEY: KEY, ANTHROPIC_BASE_URL: server.url }, timeoutMs: 300 });
    const timedOut = await failure(slow.step(request));
    assert.deepEqual([timedOut.kind, timedOut.retryable], ["transport", true]);
    const ac = new AbortController();
    const pending = model().step({ ...request, signal: ac.signal });
    ac.abort();
    const aborted = await failure(pending);
    assert.deepEqual([aborted.kind, aborted.retryable], ["transport", true]);
  });
});
