/**
 * The HTTP plumbing of the API of `cairn serve` (./api.ts): refusals as JSON sentences, the route
 * table's types and matching, bodies read within a size limit and parsed with a zod schema that names
 * the field at fault.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import { z } from "zod";
import type { Storage } from "../storage/contract.js";
import { checkRequestId } from "../harness/operator.js";

/** Every API path starts with this. */
export const API_PREFIX = "/api/v1/";

/** The largest request body read (an observation's payload is at most 64 KiB of JSON). */
export const MAX_BODY_BYTES = 256 * 1024;

/** A refusal: HTTP status, a stable code, and the sentence. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** What a route gets. `params` are the `{name}` segments of its path, decoded. */
export interface ApiRequest {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly params: Readonly<Record<string, string>>;
  readonly query: URLSearchParams;
  /** The JSON body (POST; `{}` when empty). */
  readonly body: unknown;
  /** The request id from the Idempotency-Key header, if any. */
  readonly idempotencyKey: string | undefined;
  readonly api: ApiContext;
}

/** A JSON answer, or null when the route wrote the response itself (the event stream). */
export type ApiReply = { readonly status: number; readonly body: unknown; readonly headers?: Record<string, string> } | null;

/** One entry of the route table: `path` segments in braces are parameters. */
export interface Route {
  readonly method: "GET" | "POST";
  readonly path: string;
  readonly summary: string;
  handle(r: ApiRequest): Promise<ApiReply>;
}

/** What every route shares: the database served and how long to follow the owner's answer. */
/** The most event streams open at once: each holds a storage reader (on sqlite, a file descriptor). */
export const MAX_STREAMS = 64;

export interface ApiContext {
  readonly storage: Storage;
  readonly name: string;
  readonly logger: Logger;
  /** The default and the longest wait for an owner's answer to a steer request. */
  readonly waitMs: number;
  /** How often an event stream looks for new events. */
  readonly pollMs: number;
  /** How often an event stream sends a comment, so proxies keep it open. */
  readonly heartbeatMs: number;
  /** Aborted when the server closes: event streams end. */
  readonly closing: AbortSignal;
  /** The event streams open now, each settled once its response ended: closing waits for them. */
  readonly streams: Set<Promise<void>>;
}

/** Parses `body` with `schema`; a mismatch is a 400 naming the field (and, for an unknown one, the fields known). */
export function parseBody<T extends z.ZodTypeAny>(schema: T, body: unknown): z.infer<T> {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ApiError(400, "bad_body", "the body must be a JSON object");
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  if (issue.code === "unrecognized_keys") {
    const known = schema instanceof z.ZodObject ? Object.keys((schema as unknown as z.ZodObject).shape).join(", ") : "";
    throw new ApiError(400, "unknown_field", `unknown field ${issue.keys.map((k) => JSON.stringify(k)).join(", ")} in the body; this route takes ${known}`);
  }
  const where = issue.path.length > 0 ? `field "${issue.path.join(".")}"` : "the body";
  throw new ApiError(400, "bad_field", `${where}: ${issue.message}`);
}

/** The request id of a steer or post: `id` in the body or Idempotency-Key; both must agree. */
export function requestId(r: ApiRequest, fromBody: string | undefined): string | undefined {
  if (fromBody !== undefined && r.idempotencyKey !== undefined && fromBody !== r.idempotencyKey) {
    throw new ApiError(400, "bad_field", `the body's "id" (${JSON.stringify(fromBody.slice(0, 80))}) and the Idempotency-Key header differ; send one of them, or the same value in both`);
  }
  const id = fromBody ?? r.idempotencyKey;
  if (id === undefined) return undefined;
  try {
    checkRequestId(id);
  } catch (err) {
    throw new ApiError(400, "bad_field", (err as Error).message);
  }
  return id;
}

/** A non-negative integer query parameter, or `fallback`; anything else is a 400 naming it. */
export function intParam(q: URLSearchParams, name: string, fallback: number, max: number): number {
  const v = q.get(name);
  if (v === null || v === "") return fallback;
  if (!/^\d{1,15}$/.test(v) || Number(v) > max) throw new ApiError(400, "bad_query", `query parameter "${name}" must be a whole number from 0 to ${max}, got ${JSON.stringify(v.slice(0, 40))}`);
  return Number(v);
}

/** Matches `path` against a route's pattern; the parameters, or null. */
export function match(pattern: string, path: string): Record<string, string> | null {
  const want = pattern.split("/");
  const got = path.split("/");
  if (want.length !== got.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    const w = want[i]!;
    const g = got[i]!;
    if (w.startsWith("{") && w.endsWith("}")) {
      if (g === "") return null;
      try {
        params[w.slice(1, -1)] = decodeURIComponent(g);
      } catch {
        return null;
      }
    } else if (w !== g) return null;
  }
  return params;
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = `${JSON.stringify(body)}\n`;
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "cache-control": "no-store", "x-content-type-options": "nosniff", "content-length": String(Buffer.byteLength(text)), ...headers });
  res.end(text);
}

/** Sends an API refusal as JSON. */
export function sendApiError(res: ServerResponse, err: ApiError): void {
  sendJson(res, err.status, { error: { code: err.code, message: err.message } }, err.headers);
}

/** How long a body may take to arrive once its headers did: a client trickling bytes cannot hold a request open. */
export const BODY_TIMEOUT_MS = 10_000;

/**
 * Reads a JSON body of at most MAX_BODY_BYTES within `timeoutMs`; `{}` when empty. A refusal while
 * the body is still arriving (too large, too slow) closes the connection after the answer, so the
 * rest is never read.
 */
export async function readBody(req: IncomingMessage, timeoutMs = BODY_TIMEOUT_MS): Promise<unknown> {
  const close = { connection: "close" };
  const declared = Number(req.headers["content-length"] ?? "0");
  if (declared > MAX_BODY_BYTES) throw new ApiError(413, "too_large", `the body is ${declared} bytes; at most ${MAX_BODY_BYTES} are read (post a reference to large data instead)`, close);
  const raw = await new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      req.off("data", onData).off("end", onEnd).off("error", onError);
      if (err === null) return resolve(Buffer.concat(chunks));
      req.pause();
      reject(err);
    };
    const timer = setTimeout(() => finish(new ApiError(408, "body_timeout", `the body did not arrive within ${timeoutMs / 1000} s of the headers; send it whole, at once`, close)), timeoutMs);
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) finish(new ApiError(413, "too_large", `the body is larger than ${MAX_BODY_BYTES} bytes; post a reference to large data instead`, close));
      else chunks.push(chunk);
    };
    const onEnd = (): void => finish(null);
    // The client went away mid-body: nobody reads the answer, but the request ends here, cleanly.
    const onError = (): void => finish(new ApiError(400, "body_aborted", "the connection closed before the body was complete; send the request again", close));
    req.on("data", onData).on("end", onEnd).on("error", onError);
  });
  const text = raw.toString("utf8");
  if (text.trim() === "") return {};
  const type = (req.headers["content-type"] ?? "").split(";")[0]!.trim().toLowerCase();
  if (type !== "application/json") throw new ApiError(415, "bad_content_type", `the body must be JSON sent with "Content-Type: application/json", got ${JSON.stringify(type || "no Content-Type")}`);
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new ApiError(400, "bad_json", `the body is not valid JSON (${(err as Error).message}); send a JSON object`);
  }
}

/** Whether an Origin header names this server's Host (which passed the access gate); any scheme, for a TLS proxy. */
export function sameOrigin(origin: string, req: IncomingMessage): boolean {
  try {
    return new URL(origin).host === new URL(`http://${req.headers.host ?? ""}`).host;
  } catch {
    return false;
  }
}

/** The table, one line a route, for a 404's message. */
export function listing(routes: readonly Route[]): string {
  return routes.map((r) => `${r.method} ${r.path}`).join(", ");
}

