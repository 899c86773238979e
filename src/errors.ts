/**
 * The one error base of Cairn. Callers branch on `code`, never on message text.
 *
 * Every error says what went wrong and what to do in `message`; `retryable` answers whether the
 * same call may succeed later; `action` (for resets) says whether to stop or reopen.
 */
export type ErrorCode =
  | "reset"
  | "rejected"
  | "uncertain"
  | "not_found"
  | "unavailable"
  | "config"
  | "usage"
  | "model"
  | "internal";

export class CairnError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;

  constructor(code: ErrorCode, message: string, options: { retryable?: boolean; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "CairnError";
    this.code = code;
    this.retryable = options.retryable ?? false;
  }
}

/** Bad configuration or usage: the message names the flag or option and what it accepts. */
export class ConfigError extends CairnError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super("config", message, options);
    this.name = "ConfigError";
  }
}

/** True when `err` is a CairnError with the given code (works across module copies). */
export function hasCode(err: unknown, code: ErrorCode): boolean {
  return typeof err === "object" && err !== null && (err as { code?: unknown }).code === code && err instanceof Error;
}
