/**
 * The Model contract: one call per attempt of a round, returning exactly one `step` patch.
 *
 * A Model is stateless across calls: the State snapshot is the model's whole context (there is no
 * transcript), so a restarted run that calls `step` with the same State gets an equivalent request.
 * Everything a caller branches on is in `ModelError.kind` and `ModelError.retryable`, never in text.
 */
import { CairnError } from "../errors.js";
import type { TokenUsage } from "../state/events.js";
import type { State } from "../state/schema.js";

/** The previous attempt's patch of this round was refused by admission: the model is shown why. */
export interface ModelRejection {
  readonly code: string;
  readonly reason: string;
  readonly patch: unknown;
}

/** One model call. */
export interface ModelRequest {
  /** The round's fixed snapshot; `state.runtime.inbox` holds the observations delivered this round. */
  readonly state: State;
  /** The durable round id. */
  readonly turn: string;
  /** 1-based within the turn. */
  readonly attempt: number;
  /** Set when the previous attempt's patch was refused: it is shown to the model. */
  readonly rejection?: ModelRejection;
  /** Aborts the call; the call then fails with a retryable `transport` ModelError. */
  readonly signal?: AbortSignal;
}

/** A complete reply: the `patch` argument of the one `step` tool call (not yet validated as a patch). */
export interface ModelReply {
  readonly patch: unknown;
  /** Tokens the provider reported for this call, or null when it reported none. */
  readonly usage: TokenUsage | null;
}

/** A model provider. `step` resolves with one patch or rejects with a ModelError. */
export interface Model {
  /** `anthropic/<model>`, `openai/<model>` or `scripted:<file>`: stable, safe to log (no secrets). */
  readonly name: string;
  step(req: ModelRequest): Promise<ModelReply>;
  close?(): Promise<void>;
}

/**
 * What went wrong with a call:
 * - `transport`: connection refused or reset, timeout, abort, unreadable response body (retryable);
 * - `http`: the provider answered with an error status (retryable for 408, 409, 425, 429 and 5xx);
 * - `no_tool_call` / `multiple_tool_calls`: the reply did not hold exactly one `step` call (retryable);
 * - `bad_arguments`: the tool arguments were truncated, not JSON, or had no `patch` array (retryable);
 * - `auth`: 401 or 403 (not retryable: fix the key);
 * - `config`: missing key, unknown provider, unknown model or base URL (404), unreadable script (not retryable).
 */
export type ModelErrorKind = "transport" | "http" | "no_tool_call" | "multiple_tool_calls" | "bad_arguments" | "auth" | "config";

/**
 * A failed model call (`code: "model"`). `retryable` says whether the same request may succeed later;
 * `usage` is what the provider reported for the failed call (a reply with no tool call still cost
 * tokens), or null. `status` is the HTTP status for `http` and `auth` failures. The message never holds
 * an API key.
 */
export class ModelError extends CairnError {
  override readonly retryable: boolean;
  readonly usage: TokenUsage | null;
  readonly kind: ModelErrorKind;
  readonly status: number | null;
  /** How long the provider asked to wait before the next call (Retry-After), in ms, or null. */
  readonly retryAfterMs: number | null;

  constructor(
    kind: ModelErrorKind,
    message: string,
    options: { retryable: boolean; usage?: TokenUsage | null; status?: number | null; retryAfterMs?: number | null; cause?: unknown },
  ) {
    super("model", message, { retryable: options.retryable, cause: options.cause });
    this.name = "ModelError";
    this.kind = kind;
    this.retryable = options.retryable;
    this.usage = options.usage ?? null;
    this.status = options.status ?? null;
    this.retryAfterMs = options.retryAfterMs ?? null;
  }
}

/** True when `err` is a ModelError (by code and shape, so it works across module copies). */
export function isModelError(err: unknown): err is ModelError {
  return err instanceof Error && (err as { code?: unknown }).code === "model" && typeof (err as { kind?: unknown }).kind === "string";
}
