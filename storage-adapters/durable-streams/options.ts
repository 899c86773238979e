/**
 * Options of the Durable Streams adapter, validated once (a ConfigError naming the option), and what
 * every part of one Storage shares.
 */
import { ConfigError } from "../../src/errors.js";
import type { FaultHook } from "../../src/storage/contract.js";
import { Wire } from "./http.js";
import { ROLL_RECORDS } from "./lease-fold.js";
import { PRODUCER_ID } from "./records.js";

/** The owner lease's default length (as `cairn serve --lease`'s). */
export const DEFAULT_LEASE_MS = 10_000;

export interface DurableStreamsOptions {
  /**
   * The base URL under which the database's streams live: `<url>/<name>/log` and so on. For the
   * reference server, `http://HOST:PORT/v1/stream` (any path works there).
   */
  readonly url: string;
  /** Fault points called by every commit (tests only). */
  readonly faults?: FaultHook;
  /** A request (not a long-poll) without an answer after this long counts as unanswered (default 10 000 ms). */
  readonly requestTimeoutMs?: number;
  /**
   * How long an append whose answer was lost (no answer, a reset, a 5xx) is retried with the same
   * producer seq before the handle gives up, is poisoned and reports StorageFailure (default 30 000 ms).
   * While the server is down, a commit waits this long.
   */
  readonly outageMs?: number;
  /** The client-side bound of one long-poll; the server usually answers sooner (default 60 000 ms). */
  readonly longPollTimeoutMs?: number;
  /**
   * The owner lease's length (default 10 000 ms, at least 1000): a standby takes over at most about
   * this long after the owner stopped renewing (lease.ts).
   */
  readonly leaseMs?: number;
  /** Records per owner-lease generation before it is rolled over (default ROLL_RECORDS; tests set it low). */
  readonly leaseRollRecords?: number;
}

/** What the parts of one Storage share. */
export interface DsContext {
  readonly url: string;
  readonly wire: Wire;
  readonly faults: FaultHook | undefined;
  readonly outageMs: number;
  readonly producerId: string;
  readonly leaseMs: number;
  readonly leaseRollRecords: number;
}

function positive(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isFinite(value) || value <= 0) throw new ConfigError(`durable-streams storage: ${name} must be a positive number of ms, got ${String(value)}.`);
  return value;
}

/** Validates `options`; throws ConfigError naming the option. */
export function contextOf(options: DurableStreamsOptions): DsContext {
  const raw = options?.url;
  if (typeof raw !== "string" || raw.trim() === "") throw new ConfigError("durable-streams storage: url is required (--url, or CAIRN_DS_URL): the base URL the database streams live under, e.g. http://127.0.0.1:4437/v1/stream.");
  let parsed: URL;
  try {
    parsed = new URL(raw.trim());
  } catch {
    throw new ConfigError(`durable-streams storage: url "${raw}" is not a URL; give the base the streams live under, e.g. http://127.0.0.1:4437/v1/stream.`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new ConfigError(`durable-streams storage: url "${raw}" must be http:// or https://.`);
  if (parsed.search !== "" || parsed.hash !== "") throw new ConfigError(`durable-streams storage: url "${raw}" must not carry a query or a fragment.`);
  const url = parsed.toString().replace(/\/+$/, "");
  const requestTimeoutMs = positive("requestTimeoutMs", options.requestTimeoutMs, 10_000);
  const longPollTimeoutMs = positive("longPollTimeoutMs", options.longPollTimeoutMs, 60_000);
  const leaseMs = positive("leaseMs", options.leaseMs, DEFAULT_LEASE_MS);
  if (leaseMs < 1000) throw new ConfigError(`durable-streams storage: leaseMs must be at least 1000 ms, got ${String(leaseMs)}.`);
  return {
    url,
    wire: new Wire(url, { requestTimeoutMs, longPollTimeoutMs }),
    faults: options.faults,
    outageMs: positive("outageMs", options.outageMs, 30_000),
    producerId: PRODUCER_ID,
    leaseMs: Math.round(leaseMs),
    leaseRollRecords: Math.max(2, Math.floor(positive("leaseRollRecords", options.leaseRollRecords, ROLL_RECORDS))),
  };
}
