/**
 * The Anthropic Messages API provider, through the official SDK (@anthropic-ai/sdk).
 *
 * Why not @mariozechner/pi-ai, which wraps this SDK: its stream functions catch every SDK error and
 * keep only `error.message` (providers/anthropic.js: `output.errorMessage = error.message`), so the
 * HTTP status and the error class are lost and 401 could be told from 429, 5xx or a reset connection
 * only by parsing message text (STYLE.md: retryability is never decided by regex on messages). It also
 * repairs cut-off tool-call JSON with partial-json, turning a truncated `step` call into a shorter,
 * valid-looking patch. The SDK gives typed errors with `status`, a `fetch` to inject, and no retries
 * of its own (`maxRetries: 0`: the harness records and retries every attempt itself).
 *
 * One non-streaming request per call: system prompt, the `step` tool forced with `tool_choice`
 * (parallel tool use disabled), one user message holding the State.
 */
import type Anthropic from "@anthropic-ai/sdk";
import type { TokenUsage } from "../state/events.js";
import type { Model, ModelReply, ModelRequest } from "./contract.js";
import { renderUserMessage, STEP_TOOL, SYSTEM_PROMPT } from "./prompt.js";
import { patchFromToolCalls, sdkFailure, type RawToolCall } from "./wire.js";

/** A `fetch` implementation the SDK calls instead of the global one. */
export type FetchLike = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/** Everything the Anthropic provider needs, resolved by `createModel` (no environment reads here). */
export interface AnthropicModelOptions {
  /** The model id, e.g. `claude-sonnet-4-5`. */
  readonly model: string;
  readonly apiKey: string;
  /** Without `/v1`, e.g. `https://api.anthropic.com`. */
  readonly baseUrl: string;
  readonly maxTokens: number;
  readonly timeoutMs: number;
  readonly fetch?: FetchLike;
}

/** Calls the Anthropic Messages API once per `step`; see the module comment. */
export class AnthropicModel implements Model {
  readonly name: string;
  /** The SDK and its client, loaded on the first call (see `sdk`). */
  private loaded: Promise<{ readonly Sdk: typeof Anthropic; readonly client: Anthropic }> | null = null;
  private readonly options: AnthropicModelOptions;

  constructor(options: AnthropicModelOptions) {
    this.options = options;
    this.name = `anthropic/${options.model}`;
  }

  /**
   * The SDK is imported on the first call, not with this module: a command that never calls this
   * provider (status, log, a scripted run) does not pay for loading it.
   */
  private sdk(): Promise<{ readonly Sdk: typeof Anthropic; readonly client: Anthropic }> {
    const options = this.options;
    this.loaded ??= import("@anthropic-ai/sdk").then(({ default: Sdk }) => ({
      Sdk,
      client: new Sdk({
        apiKey: options.apiKey,
        // Explicit nulls: the SDK would otherwise read ANTHROPIC_AUTH_TOKEN and ANTHROPIC_BASE_URL itself.
        authToken: null,
        baseURL: options.baseUrl,
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
    let message: Anthropic.Message;
    try {
      message = await client.messages.create(
        {
          model: this.options.model,
          max_tokens: this.options.maxTokens,
          system: SYSTEM_PROMPT,
          tools: [
            {
              name: STEP_TOOL.name,
              description: STEP_TOOL.description,
              input_schema: STEP_TOOL.parameters as unknown as Anthropic.Messages.Tool.InputSchema,
            },
          ],
          tool_choice: { type: "tool", name: STEP_TOOL.name, disable_parallel_tool_use: true },
          messages: [{ role: "user", content: renderUserMessage(req) }],
        },
        req.signal === undefined ? {} : { signal: req.signal },
      );
    } catch (err) {
      throw sdkFailure(err, Sdk, this.name, [this.options.apiKey]);
    }
    const usage = anthropicUsage(message.usage);
    const content: readonly { type: string }[] = Array.isArray(message.content) ? message.content : [];
    const calls: RawToolCall[] = [];
    for (const block of content) {
      if (block.type === "tool_use") {
        const b = block as Anthropic.Messages.ToolUseBlock;
        calls.push({ name: b.name, arguments: { parsed: b.input } });
      }
    }
    const patch = patchFromToolCalls(calls, usage, message.stop_reason === "max_tokens", this.name);
    return { patch, usage };
  }
}

/** Input tokens include cache writes and reads (all were sent); null when the reply carried no usage. */
function anthropicUsage(u: Partial<Anthropic.Messages.Usage> | null | undefined): TokenUsage | null {
  if (u === null || u === undefined) return null;
  const n = (v: unknown): number => (typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : 0);
  if (typeof u.input_tokens !== "number" && typeof u.output_tokens !== "number") return null;
  return {
    input_tokens: n(u.input_tokens) + n(u.cache_creation_input_tokens) + n(u.cache_read_input_tokens),
    output_tokens: n(u.output_tokens),
  };
}
