/**
 * The OpenAI-compatible provider against a local server speaking chat completions (non-streaming
 * JSON, which is what the provider sends: `stream: false`).
 */
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";
import { ModelError, type ModelRequest } from "../../src/model/contract.js";
import { SYSTEM_PROMPT, STEP_TOOL } from "../../src/model/prompt.js";
import { createModel } from "../../src/model/providers.js";
import { initialState } from "../../src/state/schema.js";
import { startFakeServer, type FakeServer } from "./fake-server.js";

const KEY = "sk-proj-test-SECRET-9876543210";
const PATCH = [
  { op: "test", path: "/revision", value: 0 },
  { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["python3", "-m", "pytest", "-q"] } },
];

function completion(toolCalls: unknown[] | undefined, finish_reason = "tool_calls", usage: unknown = { prompt_tokens: 900, completion_tokens: 60, total_tokens: 960 }) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion",
    created: 1,
    model: "gpt-test",
    choices: [{ index: 0, finish_reason, message: { role: "assistant", content: toolCalls === undefined ? "Done, I believe." : null, tool_calls: toolCalls } }],
    usage,
  };
}
function call(args: string, name = "step", id = "call_1") {
  return { id, type: "function", function: { name, arguments: args } };
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

describe("openai-compatible provider", () => {
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
  const model = () => createModel("openai/gpt-test", { env: { OPENAI_API_KEY: KEY, OPENAI_BASE_URL: `${server.url}/v1` }, maxTokens: 2048 });

  test("a good tool call returns the patch and usage; the request carries the prompt, the tool and the State", async () => {
    server.reply({ kind: "json", status: 200, body: completion([call(JSON.stringify({ patch: PATCH }))]) });
    const m = model();
    assert.equal(m.name, "openai/gpt-test");
    const reply = await m.step(request);
    assert.deepEqual(reply.patch, PATCH);
    assert.deepEqual(reply.usage, { input_tokens: 900, output_tokens: 60 });

    assert.equal(server.requests.length, 1);
    const req = server.requests[0]!;
    assert.equal(req.method, "POST");
    assert.equal(req.url, "/v1/chat/completions");
    assert.equal(req.headers.authorization, `Bearer ${KEY}`);
    const body = req.body as Record<string, unknown>;
    assert.equal(body.model, "gpt-test");
    assert.equal(body.max_tokens, 2048, "a non-OpenAI host gets max_tokens");
    assert.equal(body.stream, false);
    const messages = body.messages as { role: string; content: string }[];
    assert.deepEqual(messages.map((m) => m.role), ["system", "user"]);
    assert.equal(messages[0]!.content, SYSTEM_PROMPT);
    assert.ok(messages[1]!.content.includes(JSON.stringify(request.state)), "the user message holds the State");
    assert.deepEqual(body.tools, [{ type: "function", function: { name: "step", description: STEP_TOOL.description, parameters: STEP_TOOL.parameters } }]);
    assert.equal(body.tool_choice, "required");
  });

  test("a patch sent as a JSON string is decoded", async () => {
    server.reply({ kind: "json", status: 200, body: completion([call(JSON.stringify({ patch: JSON.stringify(PATCH) }))]) });
    const reply = await model().step(request);
    assert.deepEqual(reply.patch, PATCH);
  });

  test("a local server needs no key when a base URL is set", async () => {
    server.reply({ kind: "json", status: 200, body: completion([call(JSON.stringify({ patch: PATCH }))], "tool_calls", null) });
    const m = createModel("openai/qwen2.5-coder:7b", { env: { OPENAI_BASE_URL: `${server.url}/v1` } });
    const reply = await m.step(request);
    assert.deepEqual(reply.patch, PATCH);
    assert.equal(reply.usage, null, "no usage reported: null, not zero");
    assert.equal(server.requests[0]!.headers.authorization, "Bearer no-key");
  });

  test("a 5xx is a retryable http error", async () => {
    server.reply({ kind: "json", status: 502, body: { error: { message: "bad gateway" } } });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "http");
    assert.equal(err.retryable, true);
    assert.equal(err.status, 502);
    assert.equal(server.requests.length, 1, "the SDK does not retry on its own");
  });

  test("a 429 is retryable, a 400 is not", async () => {
    server.reply({ kind: "json", status: 429, body: { error: { message: "rate limited" } } });
    const e429 = await failure(model().step(request));
    assert.deepEqual([e429.kind, e429.retryable], ["http", true]);
    server.reply({ kind: "json", status: 400, body: { error: { message: "context too long" } } });
    const e400 = await failure(model().step(request));
    assert.deepEqual([e400.kind, e400.retryable], ["http", false]);
  });

  test("a 401 is not retryable and the key is not in the message", async () => {
    server.reply({ kind: "json", status: 401, body: { error: { message: `Incorrect API key provided: ${KEY}`, type: "invalid_request_error", code: "invalid_api_key" } } });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "auth");
    assert.equal(err.retryable, false);
    assert.equal(err.status, 401);
    assert.ok(!err.message.includes(KEY), err.message);
    assert.ok(!JSON.stringify(err).includes(KEY));
  });

  test("truncated tool arguments are bad_arguments, retryable, with usage", async () => {
    const cut = JSON.stringify({ patch: PATCH }).slice(0, 40);
    server.reply({ kind: "json", status: 200, body: completion([call(cut)], "length") });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "bad_arguments");
    assert.equal(err.retryable, true);
    assert.deepEqual(err.usage, { input_tokens: 900, output_tokens: 60 });
    // The same cut-off text without the length signal is still refused: it is not JSON.
    server.reply({ kind: "json", status: 200, body: completion([call(cut)]) });
    const err2 = await failure(model().step(request));
    assert.deepEqual([err2.kind, err2.retryable], ["bad_arguments", true]);
  });

  test("no tool call is retryable no_tool_call, with usage", async () => {
    server.reply({ kind: "json", status: 200, body: completion(undefined, "stop") });
    const err = await failure(model().step(request));
    assert.equal(err.kind, "no_tool_call");
    assert.equal(err.retryable, true);
    assert.deepEqual(err.usage, { input_tokens: 900, output_tokens: 60 });
  });

  test("two tool calls are retryable multiple_tool_calls", async () => {
    const args = JSON.stringify({ patch: PATCH });
    server.reply({ kind: "json", status: 200, body: completion([call(args, "step", "a"), call(args, "step", "b")]) });
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

  test("an injected fetch is used instead of the global one", async () => {
    server.reply({ kind: "json", status: 200, body: completion([call(JSON.stringify({ patch: PATCH }))]) });
    const seen: string[] = [];
    const m = createModel("openai/gpt-test", {
      env: {},
      apiKey: KEY,
      baseUrl: `${server.url}/v1`,
      fetch: (input, init) => {
        seen.push(String(input instanceof Request ? input.url : input));
        return fetch(input, init);
      },
    });
    await m.step(request);
    assert.deepEqual(seen, [`${server.url}/v1/chat/completions`]);
  });
});
