/**
 * createModel: spec parsing and configuration errors (no network), and the prompt's contents.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ModelError } from "../../src/model/contract.js";
import { renderUserMessage, STEP_TOOL, SYSTEM_PROMPT } from "../../src/model/prompt.js";
import { createModel } from "../../src/model/providers.js";
import { initialState } from "../../src/state/schema.js";

function configError(fn: () => unknown): ModelError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ModelError, String(err));
    assert.equal(err.kind, "config");
    assert.equal(err.retryable, false);
    assert.equal(err.code, "model");
    return err;
  }
  assert.fail("expected a config ModelError");
}

describe("createModel", () => {
  test("a missing key names the environment variable", () => {
    const a = configError(() => createModel("anthropic/claude-x", { env: {} }));
    assert.match(a.message, /ANTHROPIC_API_KEY/);
    const o = configError(() => createModel("openai/gpt-x", { env: {} }));
    assert.match(o.message, /OPENAI_API_KEY/);
  });

  test("keys come from the env option, then the apiKey option overrides; names carry no key", () => {
    const m = createModel("anthropic/claude-x", { env: { ANTHROPIC_API_KEY: "sk-1234567890" } });
    assert.equal(m.name, "anthropic/claude-x");
    const o = createModel("openai/meta-llama/Llama-3.1-8B-Instruct", { env: {}, apiKey: "k-123456", baseUrl: "http://127.0.0.1:8000/v1" });
    assert.equal(o.name, "openai/meta-llama/Llama-3.1-8B-Instruct");
  });

  test("unknown specs, empty model names, bad URLs and bad limits are config errors", () => {
    assert.match(configError(() => createModel("gemini/x", { env: {} })).message, /anthropic\/<model>, openai\/<model> or scripted:<file>/);
    configError(() => createModel("anthropic/", { env: { ANTHROPIC_API_KEY: "k-123456" } }));
    configError(() => createModel("openai", { env: {} }));
    configError(() => createModel("scripted:", { env: {} }));
    assert.match(configError(() => createModel("openai/x", { env: { OPENAI_BASE_URL: "localhost:8000" } })).message, /OPENAI_BASE_URL/);
    assert.match(configError(() => createModel("anthropic/x", { env: { ANTHROPIC_API_KEY: "k-123456" }, maxTokens: 0 })).message, /maxTokens/);
    assert.match(configError(() => createModel("anthropic/x", { env: { ANTHROPIC_API_KEY: "k-123456" }, timeoutMs: 1.5 })).message, /timeoutMs/);
  });

  test("a key never appears in a config error", () => {
    const secret = "sk-very-secret-key-42";
    const e = configError(() => createModel("anthropic/x", { env: { ANTHROPIC_API_KEY: secret }, baseUrl: "ftp://example" }));
    assert.ok(!e.message.includes(secret));
  });
});

describe("prompt", () => {
  test("the system prompt teaches the rules admission enforces, in under 1200 words", () => {
    const words = SYSTEM_PROMPT.split(/\s+/).filter(Boolean).length;
    assert.ok(words < 1200, `${words} words`);
    for (const needle of [
      "rio.state/1",
      "uv run --script",
      "# /// script",
      "never through a shell",
      '{"op":"test","path":"/revision","value":N}',
      "POSITION",
      '"path":"/cells/2/id"',
      "runtime.next_cell_id",
      "previous_id",
      "cannot be replaced",
      "descending",
      "runs at most once",
      "UnknownExecution",
      '"role":"resolution"',
      "evidence_refs",
      '"role":"cancel"',
      '"role":"conclusion"',
      "validator",
      "through files",
      "summary",
    ]) {
      assert.ok(SYSTEM_PROMPT.includes(needle) || SYSTEM_PROMPT.toLowerCase().includes(needle.toLowerCase()), `prompt lacks ${needle}`);
    }
  });

  test("the step tool takes {patch: op[]}", () => {
    assert.equal(STEP_TOOL.name, "step");
    assert.deepEqual(STEP_TOOL.parameters.required, ["patch"]);
    assert.equal(STEP_TOOL.parameters.properties.patch.type, "array");
  });

  test("the user message is the compact State, plus the rejection when there is one", () => {
    const state = initialState("s1", "goal");
    const plain = renderUserMessage({ state, turn: "s1:t1", attempt: 1 });
    assert.ok(plain.includes(JSON.stringify(state)));
    assert.ok(!plain.includes("refused"));
    const refused = renderUserMessage({ state, turn: "s1:t1", attempt: 2, rejection: { code: "previous_id", reason: "/cells/0 holds cell 7", patch: [{ op: "x" }] } });
    assert.ok(refused.includes("previous_id") && refused.includes("/cells/0 holds cell 7") && refused.includes('[{"op":"x"}]'));
  });
});
