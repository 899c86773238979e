/**
 * The Durable Streams wire, as this adapter uses it (PROTOCOL.md of the durable-streams project):
 * PUT creates a stream, POST appends (with or without the idempotent producer headers), GET reads
 * from an offset (catch-up or `live=long-poll`), HEAD and DELETE. Every stream is `application/json`:
 * one POST body (a JSON object) is one message, and a read answers the messages after an offset as a
 * JSON array, so message boundaries survive.
 *
 * Why not `@durable-streams/client`: its `append` resolves to nothing (a 200 "appended" and a 204
 * "duplicate, already there" look alike) and reports no offset, and its idempotent producer picks its
 * own epochs and batches on its own. Ownership here is decided by exactly those answers (a claim at
 * epoch E answered 204 means someone else may hold E), so the few requests are made directly.
 *
 * Every answer is classified here, once: a definite answer is a value; a request whose outcome is
 * unknown (no answer, a reset connection, a timeout, a 5xx) is a `DsTransportError`, which callers
 * that wrote must resolve by reading, never by guessing.
 */

import { setTimeout as delay } from "node:timers/promises";

/** A request whose outcome is unknown: no answer, a timeout, a reset connection, or a server error (5xx). */
export class DsTransportError extends Error {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "DsTransportError";
  }
}

/** A definite answer this adapter cannot work with (an unexpected status, a body that is not a JSON array). */
export class DsProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DsProtocolError";
  }
}

/** The producer headers of an idempotent append. */
export interface Producer {
  readonly id: string;
  readonly epoch: number;
  readonly seq: number;
}

/** The answer to an append. */
export type AppendResult =
  /** Appended now (200 with producer headers, 204 without); `next` is the offset right after it. */
  | { readonly kind: "appended"; readonly next: string }
  /** 204 with producer headers: this (epoch, seq) was already accepted; nothing was written now. */
  | { readonly kind: "duplicate" }
  /** 403: the producer's epoch is stale; `epoch` is the server's current one. Nothing was written. */
  | { readonly kind: "stale"; readonly epoch: number | null }
  /** 409 with Producer-Expected-Seq: a gap in the producer's seqs. Nothing was written. */
  | { readonly kind: "gap"; readonly expected: number | null }
  /** 400 for a higher epoch whose seq is not 0 (the server does not know the epoch). Nothing was written. */
  | { readonly kind: "epoch-unknown" }
  /** 404 (no such stream), 410 (deleted), 413 (too large), 429 (rate limited): nothing was written. */
  | { readonly kind: "not-found" | "gone" | "too-large" | "rate-limited" };

/** The answer to a read. */
export type ReadResult =
  | { readonly kind: "data"; readonly messages: unknown[]; readonly next: string; readonly upToDate: boolean }
  /** A long-poll that ended with no new data (204). */
  | { readonly kind: "timeout"; readonly next: string }
  | { readonly kind: "not-found" }
  /** 410: the offset is before the earliest retained one, or the stream was deleted. */
  | { readonly kind: "gone" };

/** Where a read starts: the stream's beginning. */
export const START = "-1";

const JSON_TYPE = "application/json";

/** Options of the wire. */
export interface WireOptions {
  /** A catch-up request (not a long-poll) that has no answer after this long is abandoned (outcome unknown). */
  readonly requestTimeoutMs: number;
  /** A long-poll without an answer after this long is abandoned and retried. */
  readonly longPollTimeoutMs: number;
}

/** The requests of one Storage, against one base URL. */
export class Wire {
  private readonly base: string;

  constructor(
    base: string,
    private readonly options: WireOptions,
  ) {
    this.base = base.replace(/\/+$/, "");
  }

  /** The URL of the stream at `path` (segments joined with "/", each already URL-safe). */
  url(path: string): string {
    return `${this.base}/${path}`;
  }

  /** True when the stream exists (HEAD 200), false on 404 or 410. */
  async exists(path: string, signal?: AbortSignal): Promise<boolean> {
    const res = await this.send(path, { method: "HEAD" }, signal);
    if (res.status === 200) return true;
    if (res.status === 404 || res.status === 410) return false;
    throw await unexpected("HEAD", path, res);
  }

  /**
   * Creates the stream (PUT, `application/json`), idempotently: resolves "created" (201) or "exists"
   * (200: the same configuration). `body`, when given, is its first message and `closed` makes it
   * immutable (a snapshot). Throws DsProtocolError when a stream with another configuration is there (409).
   */
  async create(path: string, options: { body?: string; closed?: boolean } = {}, signal?: AbortSignal): Promise<"created" | "exists"> {
    const headers: Record<string, string> = { "content-type": JSON_TYPE };
    if (options.closed === true) headers["stream-closed"] = "true";
    const res = await this.send(path, { method: "PUT", headers, ...(options.body !== undefined ? { body: options.body } : {}) }, signal);
    if (res.status === 201) return "created";
    if (res.status === 200) return "exists";
    if (res.status === 409) throw new DsProtocolError(`${this.url(path)} exists with another configuration (not an application/json stream of this adapter); answer: ${await bodyText(res)}`);
    throw await unexpected("PUT", path, res);
  }

  /** Appends one message (a JSON object's text), with the producer headers when `producer` is given. */
  async append(path: string, body: string, producer?: Producer, signal?: AbortSignal): Promise<AppendResult> {
    const headers: Record<string, string> = { "content-type": JSON_TYPE };
    if (producer !== undefined) {
      headers["producer-id"] = producer.id;
      headers["producer-epoch"] = String(producer.epoch);
      headers["producer-seq"] = String(producer.seq);
    }
    const res = await this.send(path, { method: "POST", headers, body }, signal);
    const next = res.headers.get("stream-next-offset");
    switch (res.status) {
      case 200:
      case 204:
        await drain(res);
        if (res.status === 204 && producer !== undefined) return { kind: "duplicate" };
        if (next === null || next === "") throw new DsProtocolError(`append to ${this.url(path)} answered ${res.status} without Stream-Next-Offset`);
        return { kind: "appended", next };
      case 403:
        await drain(res);
        return { kind: "stale", epoch: intHeader(res, "producer-epoch") };
      case 409: {
        const expected = intHeader(res, "producer-expected-seq");
        const text = await bodyText(res);
        if (producer !== undefined && expected !== null) return { kind: "gap", expected };
        throw new DsProtocolError(`append to ${this.url(path)} was refused with 409 (${res.headers.get("stream-closed") === "true" ? "the stream is closed" : text})`);
      }
      case 400: {
        const text = await bodyText(res);
        // Our producer headers are well formed, so a 400 to a seq above 0 is the one the protocol names:
        // a higher epoch than the server knows must start at seq 0 (it lost, or never had, our claim).
        if (producer !== undefined && producer.seq > 0) return { kind: "epoch-unknown" };
        throw new DsProtocolError(`append to ${this.url(path)} was refused as malformed (400): ${text}`);
      }
      case 404:
        await drain(res);
        return { kind: "not-found" };
      case 410:
        await drain(res);
        return { kind: "gone" };
      case 413:
        await drain(res);
        return { kind: "too-large" };
      case 429:
        await drain(res);
        return { kind: "rate-limited" };
      default:
        throw await unexpected("POST", path, res);
    }
  }

  /**
   * Appends one message without producer headers (the owner lease's records: lease.ts); with `close`,
   * the same request closes the stream after it. "closed": the stream was closed before (nothing written).
   */
  async appendPlain(path: string, body: string, options: { close?: boolean } = {}, signal?: AbortSignal): Promise<"appended" | "closed" | "not-found"> {
    const headers: Record<string, string> = { "content-type": JSON_TYPE };
    if (options.close === true) headers["stream-closed"] = "true";
    const res = await this.send(path, { method: "POST", headers, body }, signal);
    await drain(res);
    if (res.status === 200 || res.status === 204) return "appended";
    if (res.status === 409 && res.headers.get("stream-closed") === "true") return "closed";
    if (res.status === 404 || res.status === 410) return "not-found";
    throw new DsProtocolError(`POST ${path} answered an unexpected ${res.status}`);
  }

  /**
   * Reads the messages after `offset` (START for the beginning). `live` makes it a long-poll: the
   * server answers when data arrives or its own timeout passes ("timeout"). Offsets of one stream are
   * compared as strings, which the protocol defines as their order (PROTOCOL.md section 6).
   */
  async read(path: string, offset: string, live = false, signal?: AbortSignal): Promise<ReadResult> {
    // An empty answer whose offset lies before `offset` is the reference server mid-append: its reads
    // return every whole frame in the stream file, including one written but not yet fsynced and
    // counted in its metadata, whose offset (the tail it answers with nothing to return) comes once
    // that append completes. Such a tail catches up within an append's time; one that stays behind
    // is a server that no longer holds what it returned, and is refused, never read past.
    const deadline = Date.now() + this.options.requestTimeoutMs;
    for (let pause = 5; ; pause = Math.min(pause * 2, 200)) {
      const res = await this.readOnce(path, offset, live, signal);
      if (!(res.kind === "data" && res.messages.length === 0 && offset !== START && res.next < offset)) return res;
      if (Date.now() >= deadline) {
        throw new DsProtocolError(
          `read of ${this.url(path)} from offset ${offset} answered the tail ${res.next}, before what it had already returned, for ${this.options.requestTimeoutMs} ms: the server lost or rewound data it had returned`,
        );
      }
      await delay(pause, undefined, signal === undefined ? undefined : { signal });
    }
  }

  private async readOnce(path: string, offset: string, live: boolean, signal: AbortSignal | undefined): Promise<ReadResult> {
    const query = `offset=${encodeURIComponent(offset)}${live ? "&live=long-poll" : ""}`;
    const res = await this.send(`${path}?${query}`, { method: "GET" }, signal, live ? this.options.longPollTimeoutMs : undefined);
    if (res.status === 404) {
      await drain(res);
      return { kind: "not-found" };
    }
    if (res.status === 410) {
      await drain(res);
      return { kind: "gone" };
    }
    const next = res.headers.get("stream-next-offset");
    if (res.status === 204) {
      await drain(res);
      return { kind: "timeout", next: next ?? offset };
    }
    if (res.status !== 200) throw await unexpected("GET", path, res);
    let text: string;
    try {
      text = await res.text();
    } catch (cause) {
      throw new DsTransportError(`reading ${this.url(path)} broke off mid-answer`, { cause });
    }
    if (next === null || next === "") throw new DsProtocolError(`read of ${this.url(path)} answered 200 without Stream-Next-Offset`);
    let messages: unknown;
    try {
      messages = JSON.parse(text);
    } catch {
      throw new DsProtocolError(`read of ${this.url(path)} from offset ${offset} answered a body that is not JSON (${text.length} bytes, starting ${JSON.stringify(text.slice(0, 80))})`);
    }
    if (!Array.isArray(messages)) throw new DsProtocolError(`read of ${this.url(path)} answered JSON that is not an array of messages`);
    // No message after `offset` means the tail is `offset` (PROTOCOL.md 5.6). A server that answers
    // nothing yet moves the offset forward holds bytes it cannot return as messages (the reference
    // server, after a torn frame at the end of a stream file that its recovery left in place): refuse
    // to skip them. (A tail before `offset` is handled by `read`.) Callers read until an empty answer
    // (log-view.ts) so that this check sees every tail.
    if (messages.length === 0 && offset !== START && next > offset) {
      throw new DsProtocolError(`read of ${this.url(path)} from offset ${offset} returned no message but moved the offset to ${next}: the server holds data there it cannot return (a damaged stream file?)`);
    }
    return { kind: "data", messages, next, upToDate: res.headers.get("stream-up-to-date") === "true" };
  }

  /** Deletes the stream; true when it was there. */
  async remove(path: string, signal?: AbortSignal): Promise<boolean> {
    const res = await this.send(path, { method: "DELETE" }, signal);
    await drain(res);
    if (res.status === 204 || res.status === 200) return true;
    if (res.status === 404 || res.status === 410) return false;
    throw await unexpected("DELETE", path, res);
  }

  /** One request; a failure to get a definite answer becomes DsTransportError. */
  private async send(path: string, init: RequestInit, signal: AbortSignal | undefined, timeoutMs = this.options.requestTimeoutMs): Promise<Response> {
    const timeout = AbortSignal.timeout(timeoutMs);
    const combined = signal === undefined ? timeout : AbortSignal.any([signal, timeout]);
    let res: Response;
    try {
      res = await fetch(this.url(path), { ...init, signal: combined });
    } catch (cause) {
      if (signal?.aborted === true) throw cause;
      const what = timeout.aborted ? `no answer within ${timeoutMs} ms` : describeFetchError(cause);
      throw new DsTransportError(`${init.method ?? "GET"} ${this.url(path)}: ${what}`, { cause });
    }
    if (res.status >= 500) {
      const text = await bodyText(res).catch(() => "");
      throw new DsTransportError(`${init.method ?? "GET"} ${this.url(path)} answered ${res.status} ${text.slice(0, 200)}`);
    }
    return res;
  }
}

function intHeader(res: Response, name: string): number | null {
  const v = res.headers.get(name);
  if (v === null || !/^\d+$/.test(v)) return null;
  const n = Number(v);
  return Number.isSafeInteger(n) ? n : null;
}

async function bodyText(res: Response): Promise<string> {
  try {
    return (await res.text()).slice(0, 500);
  } catch {
    return "";
  }
}

async function drain(res: Response): Promise<void> {
  try {
    await res.arrayBuffer();
  } catch {
    // The status is what counts; a body cut short changes nothing.
  }
}

async function unexpected(method: string, path: string, res: Response): Promise<DsProtocolError> {
  return new DsProtocolError(`${method} ${path} answered an unexpected ${res.status}: ${await bodyText(res)}`);
}

function describeFetchError(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code !== undefined) return `${cause.code}${cause.message !== undefined ? ` (${cause.message})` : ""}`;
  return err instanceof Error ? err.message : String(err);
}
