/**
 * What the HTTP providers share: turning one reply's tool calls into a patch, and turning a failed call
 * into a ModelError decided by the HTTP status or the error's class (never by message text), with
 * secrets scrubbed from every message.
 */
import type { TokenUsage } from "../state/events.js";
import { ModelError } from "./contract.js";
import { STEP_TOOL } from "./prompt.js";

/** One tool call as a provider returned it: arguments already parsed (Anthropic) or raw JSON text (OpenAI). */
export interface RawToolCall {
  readonly name: string;
  readonly arguments: { readonly parsed: unknown } | { readonly text: string };
}

/**
 * The patch of the one `step` call in a reply. `truncated` is the provider's "stopped at max tokens"
 * signal: arguments cut off there are refused even when what arrived happens to parse. A `patch` sent
 * as a JSON string (some OpenAI-compatible servers do that with nested arrays) is decoded.
 * Throws a retryable ModelError: no_tool_call, multiple_tool_calls or bad_arguments, carrying `usage`.
 */
export function patchFromToolCalls(calls: readonly RawToolCall[], usage: TokenUsage | null, truncated: boolean, who: string): unknown {
  const steps = calls.filter((c) => c.name === STEP_TOOL.name);
  const others = calls.filter((c) => c.name !== STEP_TOOL.name).map((c) => JSON.stringify(c.name));
  if (calls.length === 0) {
    const why = truncated ? " (the reply stopped at the token limit)" : "";
    throw new ModelError("no_tool_call", `${who} replied without calling the step tool${why}`, { retryable: true, usage });
  }
  if (calls.length > 1) {
    throw new ModelError("multiple_tool_calls", `${who} made ${calls.length} tool calls in one reply; exactly one step call is allowed`, { retryable: true, usage });
  }
  const call = steps[0];
  if (call === undefined) {
    throw new ModelError("no_tool_call", `${who} called unknown tool ${others.join(", ")} instead of step`, { retryable: true, usage });
  }
  if (truncated) {
    throw new ModelError("bad_arguments", `${who} stopped at the token limit inside the step call: the arguments are truncated (raise maxTokens or make smaller patches)`, {
      retryable: true,
      usage,
    });
  }
  let args: unknown;
  if ("text" in call.arguments) {
    try {
      args = JSON.parse(call.arguments.text);
    } catch (err) {
      throw new ModelError("bad_arguments", `${who} sent step arguments that are not valid JSON (${call.arguments.text.length} characters, probably truncated)`, {
        retryable: true,
        usage,
        cause: err,
      });
    }
  } else {
    args = call.arguments.parsed;
  }
  if (typeof args !== "object" || args === null || Array.isArray(args) || !("patch" in args)) {
    throw new ModelError("bad_arguments", `${who} sent step arguments without a "patch" field`, { retryable: true, usage });
  }
  let patch: unknown = (args as { patch: unknown }).patch;
  if (typeof patch === "string") {
    try {
      patch = JSON.parse(patch);
    } catch (err) {
      throw new ModelError("bad_arguments", `${who} sent "patch" as a string that is not valid JSON`, { retryable: true, usage, cause: err });
    }
  }
  if (!Array.isArray(patch)) {
    throw new ModelError("bad_arguments", `${who} sent a "patch" that is not an array of operations`, { retryable: true, usage });
  }
  return patch;
}

/** HTTP statuses worth retrying: timeouts, conflicts, rate limits and server errors. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 409 || status === 425 || status === 429 || status >= 500;
}

/** Removes every occurrence of each secret (non-empty, 4+ characters) from `text`. */
export function redact(text: string, secrets: readonly (string | undefined)[]): string {
  let out = text;
  for (const s of secrets) {
    if (s !== undefined && s.length >= 4) out = out.split(s).join("[redacted]");
  }
  return out;
}

/** Error classes of the official SDKs, by shape (both SDKs share it), so no `instanceof` across packages is needed. */
interface SdkErrorClasses {
  readonly APIError: abstract new (...args: never[]) => Error;
  readonly APIConnectionError: abstract new (...args: never[]) => Error;
  readonly APIConnectionTimeoutError: abstract new (...args: never[]) => Error;
  readonly APIUserAbortError: abstract new (...args: never[]) => Error;
}

/**
 * Maps an error thrown by an SDK call to a ModelError. An HTTP error status decides by status:
 * 401/403 `auth`, 404 `config` (unknown model or wrong base URL), 408/409/425/429/5xx retryable
 * `http`, other 4xx not retryable `http`. Anything that is not an answer with a status (connection
 * refused or reset, timeout, abort, a body that could not be read) is a retryable `transport` error:
 * the call may or may not have reached the provider. Secrets are scrubbed from the message.
 */
export function sdkFailure(err: unknown, sdk: SdkErrorClasses, who: string, secrets: readonly (string | undefined)[]): ModelError {
  if (err instanceof ModelError) return err;
  const detail = redact(err instanceof Error ? err.message : String(err), secrets).slice(0, 500);
  if (err instanceof sdk.APIUserAbortError) {
    return new ModelError("transport", `${who}: the call was aborted`, { retryable: true });
  }
  if (err instanceof sdk.APIConnectionTimeoutError) {
    return new ModelError("transport", `${who}: the call timed out`, { retryable: true });
  }
  if (err instanceof sdk.APIConnectionError) {
    return new ModelError("transport", `${who}: connection failed (${redact(causeChain(err), secrets).slice(0, 500)})`, { retryable: true });
  }
  if (err instanceof sdk.APIError) {
    const status = (err as { status?: unknown }).status;
    if (typeof status === "number") {
      if (status === 401 || status === 403) {
        return new ModelError("auth", `${who} refused the credentials (HTTP ${status}): check the API key. ${detail}`, { retryable: false, status });
      }
      if (status === 404) {
        return new ModelError("config", `${who} answered HTTP 404: the model name or the base URL is wrong. ${detail}`, { retryable: false, status });
      }
      const retryable = isRetryableStatus(status);
      const retryAfterMs = retryAfter((err as { headers?: unknown }).headers, Date.now());
      const wait = retryAfterMs === null ? "" : `, Retry-After ${Math.ceil(retryAfterMs / 1000)} s`;
      return new ModelError("http", `${who} answered HTTP ${status}${retryable ? ` (retryable${wait})` : ""}: ${detail}`, { retryable, status, retryAfterMs });
    }
  }
  return new ModelError("transport", `${who}: the call failed before a complete response arrived (${detail})`, { retryable: true });
}

/**
 * The delay a response's `retry-after-ms` or `retry-after` header asks for (seconds or an HTTP date),
 * in ms, capped at one hour; null when there is none or it cannot be read. Accepts a fetch `Headers`
 * or a plain record.
 */
export function retryAfter(headers: unknown, nowMs: number): number | null {
  const get = (name: string): string | null => {
    if (headers === null || headers === undefined) return null;
    if (typeof (headers as { get?: unknown }).get === "function") return (headers as { get(n: string): string | null }).get(name);
    const v = (headers as Record<string, unknown>)[name];
    return typeof v === "string" ? v : null;
  };
  const cap = (ms: number) => Math.min(Math.max(0, Math.round(ms)), 3_600_000);
  const ms = get("retry-after-ms");
  if (ms !== null && /^\s*\d+(\.\d+)?\s*$/.test(ms)) return cap(Number(ms));
  const v = get("retry-after");
  if (v === null) return null;
  if (/^\s*\d+(\.\d+)?\s*$/.test(v)) return cap(Number(v) * 1000);
  const date = Date.parse(v);
  return Number.isNaN(date) ? null : cap(date - nowMs);
}

/** "fetch failed: other side closed": the messages of an error's `cause` chain (a few levels). */
function causeChain(err: unknown): string {
  const parts: string[] = [];
  let e: unknown = (err as { cause?: unknown }).cause ?? err;
  for (let i = 0; i < 4 && e instanceof Error; i++) {
    parts.push(e.message);
    e = (e as { cause?: unknown }).cause;
  }
  return parts.length === 0 ? String(err) : parts.join(": ");
}
