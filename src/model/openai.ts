/**
 * The OpenAI-compatible chat completions provider (OpenAI, vLLM, llama.cpp server, Ollama, LiteLLM ...),
 * through the official SDK (`openai`).
 *
 * Why not @mariozechner/pi-ai: as for Anthropic (see anthropic.ts), its stream functions reduce a
 * failed call to a message string, so retryability could only be read from text; it repairs truncated
 * tool-call JSON; and it offers no way to inject `fetch` or a client for this API.
 *
 * One non-streaming request per call: a system message, the `step` function tool with
 * `tool_choice: "required"` (equivalent to naming it, as it is the only tool, and understood by more
 * local servers than the named form), one user message holding the State. `arguments` arrive as JSON
 * text and are parsed strictly, so a cut-off call is `bad_arguments`, never a shorter patch.
 */
import type OpenAI from "openai";
import type { TokenUsage } from "../state/events.js";
import type { Model, ModelReply, ModelRequest } from "./contract.js";
import { renderUserMessage, STEP_TOOL, SYSTEM_PROMPT } from "./prompt.js";
import type { FetchLike } from "./anthropic.js";
import { patchFromToolCalls, sdkFailure, type RawToolCall } from "./wire.js";

/** Everything the OpenAI-compatible provider needs, resolved by `createModel`. */
export interface OpenAIModelOptions {
  /** The model id as the server names it, e.g. `gpt-4.1` or `qwen2.5-coder:32b`. */
  readonly model: string;
  /** May be a placeholder for local servers that ignore it. */
  readonly apiKey: string;
  /** Including `/v1`, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string;
  readonly maxTokens: number;
  readonly timeoutMs: number;
  readonly fetch?: FetchLike;
}

/** Calls an OpenAI-compatible `/chat/completions` endpoint once per `step`; see the module comment. */
export class OpenAIModel implements Model {
  readonly name: string;
  /** The SDK and its client, loaded on the first call (see `sdk`). */
  private loaded: Promise<{ readonly Sdk: typeof OpenAI; readonly client: OpenAI }> | null = null;
  private readonly options: OpenAIModelOptions;
  /** api.openai.com refuses `max_tokens` for its reasoning models; most other servers only know `max_tokens`. */
  private readonly maxTokensField: "max_tokens" | "max_completion_tokens";

  constructor(options: OpenAIModelOptions) {
    this.options = options;
    this.name = `openai/${options.model}`;
    this.maxTokensField = isOpenAIHost(options.baseUrl) ? "max_completion_tokens" : "max_tokens";
  }

  /**
   * The SDK is imported on the first call, not with this module: a command that never calls this
   * provider (status, log, a scripted run) does not pay for loading it.
   */
  private sdk(): Promise<{ readonly Sdk: typeof OpenAI; readonly client: OpenAI }> {
    const options = this.options;
    this.loaded ??= import("openai").then(({ default: Sdk }) => ({
      Sdk,
      client: new Sdk({
        apiKey: options.apiKey,
        baseURL: options.baseUrl,
        // Explicit nulls: the SDK would otherwise read OPENAI_ORG_ID and OPENAI_PROJECT_ID itself.
        organization: null,
        project: null,
        maxRetries: 0,
        timeout: options.timeoutMs,
        logLevel: "off",
        ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
      }),
    }));
    return this.loaded;
  }

  /** One call. Resolves with the patch of the single `step` call; rejects with a ModelError. */
  async step(req: ModelRequest): Promise<ModelReply> {
    const { Sdk, client } = await this.sdk();
    let completion: OpenAI.Chat.Completions.ChatCompletion;
    try {
      completion = await client.chat.completions.create(
        {
          model: this.options.model,
          [this.maxTokensField]: this.options.maxTokens,
          messages: [
            { role: "system", content: SYSTEM_PROMPT },
            { role: "user", content: renderUserMessage(req) },
          ],
          tools: [
            {
              type: "function",
              function: {
                name: STEP_TOOL.name,
                description: STEP_TOOL.description,
                parameters: STEP_TOOL.parameters as unknown as Record<string, unknown>,
              },
            },
          ],
          tool_choice: "required",
          stream: false,
        },
        req.signal === undefined ? {} : { signal: req.signal },
      );
    } catch (err) {
      throw sdkFailure(err, Sdk, this.name, [this.options.apiKey]);
    }
    const usage = openaiUsage(completion.usage);
    const choice = Array.isArray(completion.choices) ? completion.choices[0] : undefined;
    const calls: RawToolCall[] = [];
    for (const call of choice?.message?.tool_calls ?? []) {
      if (call.type === "function") {
        const args: unknown = call.function.arguments;
        calls.push({ name: call.function.name, arguments: typeof args === "string" ? { text: args } : { parsed: args } });
      } else {
        calls.push({ name: `custom:${call.custom.name}`, arguments: { text: call.custom.input } });
      }
    }
    const patch = patchFromToolCalls(calls, usage, choice?.finish_reason === "length", this.name);
    return { patch, usage };
  }
}

function isOpenAIHost(baseUrl: string): boolean {
  try {
    return new URL(baseUrl).hostname === "api.openai.com";
  } catch {
    return false;
  }
}

function openaiUsage(u: OpenAI.Completions.CompletionUsage | null | undefined): TokenUsage | null {
  if (u === null || u === undefined) return null;
  const n = (v: unknown): number => (typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : 0);
  return { input_tokens: n(u.prompt_tokens), output_tokens: n(u.completion_tokens) };
}
