/**
 * The one logger of Cairn (pino): JSON lines to stderr, or pino-pretty when stderr is a terminal.
 * Library code receives a Logger and never prints. Records are written synchronously so a short CLI
 * that exits right after logging loses nothing, and pino-pretty runs in-process as a stream (not a
 * worker transport) for the same reason. Credentials are redacted at any depth (see redact.ts).
 */
import { createRequire } from "node:module";
import { pino, type DestinationStream, type Logger } from "pino";
import type PinoPretty from "pino-pretty";
import { ConfigError } from "../errors.js";
import { REDACTED, redactSecrets } from "./redact.js";

export type { Logger } from "pino";

/** The accepted `--log-level` values, most to least severe; `silent` logs nothing. */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
/** One of {@link LOG_LEVELS}. */
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Options of {@link createLogger}. */
export interface LoggerOptions {
  /** Minimum level written; default "info". Validated like `--log-level`. */
  level?: string;
  /** Human-readable output through pino-pretty; default: whether stderr is a terminal. */
  pretty?: boolean;
  /** Where records go; default stderr (fd 2), written synchronously. */
  destination?: DestinationStream;
  /** Fields on every record (e.g. `{service: "cairn"}`); redacted like any other field. */
  base?: Record<string, unknown>;
}

/** The fields a child logger is bound to; all optional, only the given ones are set. */
export interface LogBindings {
  db?: string;
  session?: string;
  cell?: number | string;
  epoch?: number;
  host?: string;
}

// pino's path redaction, as a second net: it is the only hook that also covers bindings given to a
// plain `logger.child({...})` (pino skips the bindings formatter for children). The walk in
// redact.ts covers records at any depth and in any spelling.
const REDACT_KEYS = ["password", "passwd", "secret", "token", "apiKey", "api_key", "apikey", "authorization", "Authorization", "key", "cookie", "auth", "credentials", "accessToken", "access_token", "refreshToken", "refresh_token", "privateKey", "private_key", "clientSecret", "client_secret", "env", "environment"];
/** The pino `redact` paths set on every Cairn logger (top level and one level down). */
export const REDACT_PATHS: readonly string[] = [...REDACT_KEYS, ...REDACT_KEYS.map((k) => `*.${k}`), "headers.authorization", "headers.cookie"];

/**
 * Checks a `--log-level` value and returns it typed. Throws ConfigError naming the flag and the
 * accepted values otherwise. Case-insensitive ("INFO" is "info").
 */
export function parseLogLevel(value: string): LogLevel {
  const lower = value.trim().toLowerCase();
  const found = LOG_LEVELS.find((level) => level === lower);
  if (found === undefined) {
    throw new ConfigError(`--log-level expects one of ${LOG_LEVELS.join(", ")}, got ${JSON.stringify(value)}`);
  }
  return found;
}

/**
 * pino-pretty, loaded only when a logger is pretty (a terminal): JSON logs, the default for a
 * worker, never load it. Synchronous, as createLogger is (pino-pretty is a CommonJS package).
 */
function loadPretty(): typeof PinoPretty {
  return createRequire(import.meta.url)("pino-pretty") as typeof PinoPretty;
}

/**
 * Creates the process logger. Default: level "info", JSON lines to stderr, pretty when stderr is a
 * TTY, no pid/hostname base fields (bind `host` explicitly). Throws ConfigError for a bad level.
 */
export function createLogger(opts: LoggerOptions = {}): Logger {
  const level = parseLogLevel(opts.level ?? "info");
  const usePretty = opts.pretty ?? process.stderr.isTTY === true;
  const destination: DestinationStream = usePretty
    ? loadPretty()({ destination: opts.destination ?? 2, sync: true, colorize: opts.destination === undefined && process.stderr.isTTY === true })
    : (opts.destination ?? pino.destination({ dest: 2, sync: true }));
  return pino(
    {
      level,
      base: (redactSecrets(opts.base ?? {}) as Record<string, unknown>),
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: [...REDACT_PATHS], censor: REDACTED },
      formatters: {
        // Level as its name ("info"), not pino's number: readable by people and by log queries.
        level: (label) => ({ level: label }),
        bindings: (bindings) => redactSecrets(bindings) as Record<string, unknown>,
        log: (record) => redactSecrets(record) as Record<string, unknown>,
      },
    },
    destination,
  );
}

/**
 * A child of `logger` whose every record carries the given `db`, `session`, `cell`, `epoch` and
 * `host` fields (undefined ones are left out). The parent is unchanged.
 */
export function bindLogger(logger: Logger, bindings: LogBindings): Logger {
  const fields: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(bindings)) if (value !== undefined) fields[key] = value;
  return logger.child(fields);
}
