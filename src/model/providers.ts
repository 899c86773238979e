/**
 * `createModel`: the factory the CLI calls to turn `--model SPEC` into a Model.
 *
 * Specs: `anthropic/<model>` (Anthropic Messages API), `openai/<model>` (any OpenAI-compatible chat
 * completions server: OpenAI, vLLM, llama.cpp, Ollama ...), `scripted:<file>` (offline replay).
 * The model part may itself hold slashes (`openai/meta-llama/Llama-3.1-8B-Instruct`).
 */
import { ModelError, type Model } from "./contract.js";
import { AnthropicModel, type FetchLike } from "./anthropic.js";
import { OpenAIModel } from "./openai.js";
import { ScriptedModel } from "./scripted.js";

/** Options of `createModel`; each overrides the environment. */
export interface CreateModelOptions {
  /** Where keys and base URLs are read from. Default: `process.env`. */
  readonly env?: NodeJS.ProcessEnv;
  /** Anthropic: without `/v1` (default `ANTHROPIC_BASE_URL`, then https://api.anthropic.com). OpenAI: with `/v1` (default `OPENAI_BASE_URL`, then https://api.openai.com/v1). */
  readonly baseUrl?: string;
  /** Default: `ANTHROPIC_API_KEY` or `OPENAI_API_KEY`. */
  readonly apiKey?: string;
  /** The reply's token limit. Default 8192. */
  readonly maxTokens?: number;
  /** Per call. Default 300000 (5 minutes). */
  readonly timeoutMs?: number;
  /** Replaces the global `fetch` for HTTP providers (tests, proxies). */
  readonly fetch?: FetchLike;
}

/** The reply token limit when none is given. */
export const DEFAULT_MAX_TOKENS = 8192;
/** The per-call timeout when none is given. */
export const DEFAULT_TIMEOUT_MS = 300_000;

const ANTHROPIC_DEFAULT_BASE = "https://api.anthropic.com";
const OPENAI_DEFAULT_BASE = "https://api.openai.com/v1";
/** Sent as the key to OpenAI-compatible local servers when none is configured (they ignore it). */
const NO_KEY = "no-key";

/**
 * Builds the Model for `spec`. Reads no network; a scripted file is read and validated now.
 * Throws a not-retryable ModelError of kind `config` with a sentence that says what to fix: an unknown
 * spec, an empty model name, a missing key (naming the environment variable), a base URL that is not
 * http(s), a bad maxTokens or timeoutMs, or an unreadable or invalid script. Keys never appear in
 * messages.
 */
export function createModel(spec: string, options: CreateModelOptions = {}): Model {
  const env = options.env ?? process.env;
  const maxTokens = positiveInt(options.maxTokens, DEFAULT_MAX_TOKENS, "maxTokens");
  const timeoutMs = positiveInt(options.timeoutMs, DEFAULT_TIMEOUT_MS, "timeoutMs");
  const fetchOpt = options.fetch === undefined ? {} : { fetch: options.fetch };

  if (spec.startsWith("scripted:")) {
    const file = spec.slice("scripted:".length);
    if (file === "") throw configError(`model spec "scripted:" names no file: use scripted:<path to a JSON script>`);
    return ScriptedModel.fromFile(file);
  }
  const slash = spec.indexOf("/");
  const provider = slash === -1 ? spec : spec.slice(0, slash);
  const model = slash === -1 ? "" : spec.slice(slash + 1);

  if (provider === "anthropic") {
    if (model === "") throw configError(`model spec "${spec}" names no model: use anthropic/<model>, e.g. anthropic/claude-sonnet-4-5`);
    const apiKey = nonEmpty(options.apiKey) ?? nonEmpty(env.ANTHROPIC_API_KEY);
    if (apiKey === undefined) {
      throw configError(`${spec} needs an API key: set the ANTHROPIC_API_KEY environment variable (or pass apiKey)`);
    }
    const baseUrl = httpUrl(nonEmpty(options.baseUrl) ?? nonEmpty(env.ANTHROPIC_BASE_URL) ?? ANTHROPIC_DEFAULT_BASE, "ANTHROPIC_BASE_URL");
    return new AnthropicModel({ model, apiKey, baseUrl, maxTokens, timeoutMs, ...fetchOpt });
  }
  if (provider === "openai") {
    if (model === "") throw configError(`model spec "${spec}" names no model: use openai/<model>, e.g. openai/gpt-4.1`);
    const baseUrl = httpUrl(nonEmpty(options.baseUrl) ?? nonEmpty(env.OPENAI_BASE_URL) ?? OPENAI_DEFAULT_BASE, "OPENAI_BASE_URL");
    let apiKey = nonEmpty(options.apiKey) ?? nonEmpty(env.OPENAI_API_KEY);
    if (apiKey === undefined) {
      // A key is optional for local servers (vLLM, llama.cpp, Ollama), required by OpenAI itself.
      if (new URL(baseUrl).hostname === "api.openai.com") {
        throw configError(
          `${spec} needs an API key: set the OPENAI_API_KEY environment variable (or pass apiKey); for a local server, set OPENAI_BASE_URL`,
        );
      }
      apiKey = NO_KEY;
    }
    return new OpenAIModel({ model, apiKey, baseUrl, maxTokens, timeoutMs, ...fetchOpt });
  }
  throw configError(`unknown model spec "${spec}": use anthropic/<model>, openai/<model> or scripted:<file>`);
}

function configError(message: string): ModelError {
  return new ModelError("config", message, { retryable: false });
}

function nonEmpty(v: string | undefined): string | undefined {
  return v === undefined || v.trim() === "" ? undefined : v.trim();
}

function positiveInt(v: number | undefined, fallback: number, name: string): number {
  if (v === undefined) return fallback;
  if (!Number.isInteger(v) || v <= 0) throw configError(`${name} must be a positive integer, got ${String(v)}`);
  return v;
}

function httpUrl(v: string, envName: string): string {
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    throw configError(`the base URL "${v}" (option baseUrl or ${envName}) is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw configError(`the base URL "${v}" (option baseUrl or ${envName}) must be http:// or https://`);
  }
  return v.replace(/\/+$/, "");
}
