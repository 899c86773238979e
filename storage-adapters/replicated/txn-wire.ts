/**
 * etcd's `KV.Txn` on a bare HTTP/2 stream: the commit transaction without a gRPC library.
 *
 * Why: a round commits three times, and one guarded transaction through the etcd3 client (grpc-js,
 * protobufjs) cost 0.68 to 1.33 ms of this process's CPU, against 0.46 to 0.62 ms for the same
 * request as one HTTP/2 stream with gRPC's framing (measured side by side, 2,000 transactions each).
 * The HTTP/2 connection is our own too (h2.ts): node:http2 cost about 0.1 ms per request more.
 * The commit path is its main caller (`Context.commitTxn`); the ownership lease's renewals (liveness.ts)
 * and the health monitor's member polls (health.ts) use it too (`keepAlive`, `status`); everything
 * else keeps the etcd3 client.
 *
 * What it speaks: the unary gRPC call `/etcdserverpb.KV/Txn` (one message, 5-byte framing, status
 * in the trailers or in a trailers-only response), with etcd's require-leader metadata and a
 * `grpc-timeout`. What it encodes: a TxnRequest of compares (every target) and put, range and
 * delete-range operations, as `ops.ts` builds them; a nested txn is refused. What it decodes: the
 * TxnResponse's header revision, `succeeded` and each response (range: kvs, more, count; delete:
 * deleted), in the etcd3 client's shapes, so callers read both the same way.
 *
 * Errors are the etcd3 client's error classes (its `castGrpcError` of a gRPC status), so
 * `etcd-errors.ts` classifies them as before. Anything that loses the stream or the connection
 * (refused, reset, GOAWAY, no answer within the deadline) is UNAVAILABLE or DEADLINE_EXCEEDED: an
 * outage, which the commit pipeline treats as "may have applied" and resolves by reading back. After
 * a deadline the connection is probed with a PING and dropped if that goes unanswered within 1 s,
 * so a silent member's socket is not used again, while a slow request costs only itself.
 *
 * Not used with etcd authentication (the client's token handling stays in etcd3): see `index.ts`.
 */
import { ClientClosedError, castGrpcError, type ICompare, type IKeyValue, type IRequestOp, type IResponseOp, type ITxnResponse } from "etcd3";
import { H2Connection, encodeHeaders, type H2Request, type H2Tls, type Header } from "./h2.js";

/** TLS material for https endpoints (PEM), as the etcd3 client gets it: the connection's own type. */
export type WireTls = H2Tls;

export interface TxnRequest {
  readonly compare: readonly ICompare[];
  readonly success: readonly IRequestOp[];
  readonly failure: readonly IRequestOp[];
}

const TXN_PATH = "/etcdserverpb.KV/Txn";
const KEEPALIVE_PATH = "/etcdserverpb.Lease/LeaseKeepAlive";
const STATUS_PATH = "/etcdserverpb.Maintenance/Status";
const STATUS_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];
const UNAVAILABLE = 14;
const DEADLINE_EXCEEDED = 4;
/** How long a connection's PING may go unanswered after a request timed out before the connection is dropped. */
const PROBE_MS = 1000;

/** An error as grpc-js reports a status (`code`, "CODE NAME: details"), cast to the etcd3 client's class. */
export function grpcError(code: number, details: string): Error {
  const err = new Error(`${code} ${STATUS_NAMES[code] ?? "UNKNOWN"}: ${details}`) as Error & { code: number; details: string };
  err.code = code;
  err.details = details;
  return castGrpcError(err);
}

/** One member's connection for Txn calls. Reconnects on the next call after any connection loss. */
export class TxnWire {
  private session: H2Connection | null = null;
  /** Connections whose PING after an unanswered request is outstanding. */
  private readonly probing = new WeakSet<H2Connection>();
  /** Requests in flight per connection: a connection keeps the process alive exactly while it has some. */
  private readonly inflight = new WeakMap<H2Connection, number>();
  /** Each path's header block (with or without require-leader) before its `grpc-timeout`. */
  private readonly headerPrefix = new Map<string, Buffer>();
  private readonly parsedUrl: URL;
  /** Transactions sent, other calls (lease keep-alives, status), and connections opened (tests, stats). */
  sent = 0;
  calls = 0;
  connects = 0;
  private closed = false;

  constructor(
    readonly url: string,
    private readonly tls: WireTls | undefined,
    private readonly maxReceiveBytes: number,
  ) {
    this.parsedUrl = new URL(url);
  }

  /** Sends one Txn; resolves with etcd's answer or rejects with an etcd3 error class (see the file comment). */
  txn(req: TxnRequest, timeoutMs: number): Promise<ITxnResponse> {
    if (this.closed) return Promise.reject(new ClientClosedError("KV"));
    let body: Buffer;
    try {
      body = encodeTxnRequest(req);
    } catch (err) {
      return Promise.reject(err as Error);
    }
    return this.unary(TXN_PATH, body, timeoutMs, true, decodeTxnResponse);
  }

  /**
   * Renews lease `id` once: one LeaseKeepAliveRequest on the bidirectional `Lease/LeaseKeepAlive`
   * stream, half-closed at once, so etcd answers it and ends the stream with its status. Resolves with
   * the TTL etcd reports in seconds (0: the lease is gone).
   */
  keepAlive(id: string, timeoutMs: number): Promise<number> {
    if (this.closed) return Promise.reject(new ClientClosedError("Lease"));
    let body: Buffer;
    try {
      body = frame(message([{ no: 1, varint: int64(id, "lease id") }]));
    } catch (err) {
      return Promise.reject(err as Error);
    }
    return this.unary(KEEPALIVE_PATH, body, timeoutMs, true, decodeKeepAliveTtl);
  }

  /**
   * The member's `Maintenance/Status`, of which the leader it knows ("0": none). Sent without
   * etcd's require-leader metadata: a member without a leader still answers (that is what is asked).
   */
  status(timeoutMs: number): Promise<{ readonly leader: string }> {
    if (this.closed) return Promise.reject(new ClientClosedError("Maintenance"));
    return this.unary(STATUS_PATH, EMPTY_MESSAGE, timeoutMs, false, decodeStatusLeader);
  }

  /** The request's header block: the path's fixed fields, then its deadline (gRPC's `grpc-timeout`, in ms). */
  private headers(path: string, requireLeader: boolean, timeoutMs: number): Buffer {
    const key = requireLeader ? `${path} leader` : path;
    let prefix = this.headerPrefix.get(key);
    if (prefix === undefined) {
      const fields: Header[] = [
        [":method", "POST"],
        [":scheme", this.parsedUrl.protocol === "https:" ? "https" : "http"],
        [":path", path],
        [":authority", this.parsedUrl.host],
        ["content-type", "application/grpc"],
        ["te", "trailers"],
      ];
      if (requireLeader) fields.push(["hasleader", "true"]);
      prefix = encodeHeaders(fields);
      this.headerPrefix.set(key, prefix);
    }
    return Buffer.concat([prefix, encodeHeaders([["grpc-timeout", `${Math.max(1, Math.ceil(timeoutMs))}m`]])]);
  }

  /** One request message on a new stream of `path`, its one answer decoded by `decode`. */
  private unary<T>(path: string, body: Buffer, timeoutMs: number, requireLeader: boolean, decode: (message: Buffer) => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let session: H2Connection;
      try {
        session = this.connect();
      } catch (err) {
        reject(grpcError(UNAVAILABLE, `cannot send to ${this.url}: ${(err as Error).message}`));
        return;
      }
      if (path === TXN_PATH) this.sent++;
      else this.calls++;
      const pending = (this.inflight.get(session) ?? 0) + 1;
      this.inflight.set(session, pending);
      if (pending === 1) session.ref();
      const chunks: Buffer[] = [];
      let received = 0;
      let status: number | null = null;
      let message = "";
      let httpStatus: number | null = null;
      let settled = false;
      const finish = (err: Error | null, res?: T): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        const left = (this.inflight.get(session) ?? 1) - 1;
        this.inflight.set(session, left);
        if (left === 0 && !session.destroyed) session.unref();
        if (err !== null) reject(err);
        else resolve(res!);
      };
      const timer = setTimeout(() => {
        finish(grpcError(DEADLINE_EXCEEDED, `no answer from ${this.url} within ${timeoutMs} ms`));
        request.cancel();
        // A silent member keeps its socket open: find out whether the connection still answers.
        this.probe(session);
      }, timeoutMs);
      // Settled when the answer has ended (etcd's status and message are in); a peer that answers
      // before reading all of a large body ends the stream, and the rest of the body is abandoned.
      const conclude = (): void => {
        if (settled) return;
        if (status === null) {
          if (httpStatus !== null && httpStatus !== 200) {
            const code = [429, 502, 503, 504].includes(httpStatus) ? UNAVAILABLE : 2;
            finish(grpcError(code, `${this.url} answered HTTP ${httpStatus} without a gRPC status`));
          } else {
            finish(grpcError(UNAVAILABLE, `the stream to ${this.url} ended without a status`));
          }
          return;
        }
        if (status !== 0) {
          finish(grpcError(status, message));
          return;
        }
        try {
          finish(null, decode(unframe(Buffer.concat(chunks, received))));
        } catch (err) {
          finish(grpcError(13, `cannot decode the answer to ${path} from ${this.url}: ${(err as Error).message}`));
        }
      };
      const request: H2Request = session.request(this.headers(path, requireLeader, timeoutMs), body, {
        onHeaders: (fields) => {
          for (const [name, value] of fields) {
            if (name === ":status" && httpStatus === null) httpStatus = Number(value);
            else if (name === "grpc-status") status = Number(value);
            else if (name === "grpc-message") message = decodeMessage(value);
          }
        },
        onData: (chunk) => {
          if (settled) return;
          received += chunk.length;
          if (received > this.maxReceiveBytes + 5) {
            finish(grpcError(8, `Received message larger than max (${received} vs. ${this.maxReceiveBytes})`));
            request.cancel();
            return;
          }
          chunks.push(chunk);
        },
        onEnd: conclude,
        onFail: (err) => finish(grpcError(UNAVAILABLE, `the stream to ${this.url} failed: ${err.message}`)),
      });
    });
  }

  /** Ends the connection; later calls throw ClientClosedError. */
  close(): void {
    this.closed = true;
    this.drop(this.session);
  }

  /**
   * After a request went unanswered: is the member silent (frozen, cut off: drop the connection, as
   * gRPC keepalive would) or only slow with that request (keep the connection and the other requests
   * in flight on it)? An HTTP/2 PING unanswered within PROBE_MS says silent.
   */
  private probe(session: H2Connection): void {
    if (session.destroyed || this.probing.has(session)) return;
    this.probing.add(session);
    const done = (silent: boolean): void => {
      clearTimeout(timer);
      this.probing.delete(session);
      if (silent) this.drop(session);
    };
    const timer = setTimeout(() => done(true), PROBE_MS);
    timer.unref();
    if (!session.ping((err) => done(err !== null))) done(true);
  }

  private connect(): H2Connection {
    if (this.session !== null && this.session.usable) return this.session;
    // One that takes no new request (out of stream ids) ends once its streams have.
    this.session?.close();
    const session = new H2Connection(this.parsedUrl, this.tls);
    // GOAWAY (a member shutting down): streams it processed may still be answered; new ones go on a
    // new connection. A lost connection: the next call connects again.
    session.onGoaway = () => {
      if (this.session === session) this.session = null;
      session.close();
    };
    session.onClose = () => this.drop(session);
    session.unref();
    this.session = session;
    this.connects++;
    return session;
  }

  private drop(session: H2Connection | null): void {
    if (session === null) return;
    if (this.session === session) this.session = null;
    if (!session.destroyed) session.destroy(null);
  }
}

function decodeMessage(m: string): string {
  try {
    return decodeURIComponent(m);
  } catch {
    return m;
  }
}

/** The one message of a gRPC response body (5-byte prefix: compressed flag, big-endian length). */
function unframe(buf: Buffer): Buffer {
  if (buf.length < 5) throw new Error(`a response of ${buf.length} bytes has no message`);
  if (buf[0] !== 0) throw new Error("the response is compressed, which was not asked for");
  const len = buf.readUInt32BE(1);
  if (buf.length !== 5 + len) throw new Error(`the response holds ${buf.length - 5} bytes after its prefix, which announced ${len}`);
  return buf.subarray(5);
}

// --- protobuf encoding (etcd's rpc.proto field numbers) ---------------------------------------

const COMPARE_RESULT: Record<string, number> = { Equal: 0, Greater: 1, Less: 2, NotEqual: 3 };
const COMPARE_TARGET: Record<string, number> = { Version: 0, Create: 1, Mod: 2, Value: 3, Lease: 4 };

function varintSize(n: number | bigint): number {
  if (typeof n === "bigint") return n < 128n ? 1 : 1 + varintSize(n >> 7n);
  let size = 1;
  while (n >= 128) {
    n = Math.floor(n / 128);
    size++;
  }
  return size;
}

const MAX_UINT64 = 2n ** 64n - 1n;

/**
 * int64 fields as etcd3 takes them: a number or a decimal string. Exact over 64 bits (etcd's lease
 * ids are random and above 2^53: a decimal string then, as etcd3 gives them). Negative values are
 * refused (the adapter sends none).
 */
function int64(v: string | number | undefined, what: string): number | bigint {
  if (typeof v === "string" && /^\d+$/.test(v)) {
    if (v.length <= 15) return Number(v);
    const big = BigInt(v);
    if (big > MAX_UINT64) throw new TypeError(`${what} must fit in 64 bits, got ${v}`);
    return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
  }
  const n = v ?? 0;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) throw new TypeError(`${what} must be a non-negative integer, got ${String(v)}`);
  return n;
}

function enumOf(table: Record<string, number>, v: string | number | undefined, what: string): number {
  if (v === undefined) return 0;
  const n = typeof v === "number" ? v : table[v];
  if (n === undefined) throw new TypeError(`unknown ${what} ${String(v)}`);
  return n;
}

/** A message as a list of fields, sized before it is written into one buffer. */
type Field = { readonly no: number; readonly varint: number | bigint } | { readonly no: number; readonly bytes: Buffer } | { readonly no: number; readonly msg: Message };
interface Message {
  readonly fields: Field[];
  size: number;
}

function message(fields: Field[]): Message {
  let size = 0;
  for (const f of fields) {
    size += varintSize(f.no << 3);
    if ("varint" in f) size += varintSize(f.varint);
    else {
      const len = "bytes" in f ? f.bytes.length : f.msg.size;
      size += varintSize(len) + len;
    }
  }
  return { fields, size };
}

const bytesOf = (v: Buffer | string): Buffer => (typeof v === "string" ? Buffer.from(v, "utf8") : v);

function compareMessage(c: ICompare): Message {
  const target = enumOf(COMPARE_TARGET, c.target, "compare target");
  const fields: Field[] = [];
  const result = enumOf(COMPARE_RESULT, c.result, "compare result");
  if (result !== 0) fields.push({ no: 1, varint: result });
  if (target !== 0) fields.push({ no: 2, varint: target });
  if (c.key !== undefined) fields.push({ no: 3, bytes: bytesOf(c.key) });
  // The target's value is a oneof: always sent, a zero included (as protobufjs does).
  switch (target) {
    case 0:
      fields.push({ no: 4, varint: int64(c.version, "compare version") });
      break;
    case 1:
      fields.push({ no: 5, varint: int64(c.create_revision, "compare create_revision") });
      break;
    case 2:
      fields.push({ no: 6, varint: int64(c.mod_revision, "compare mod_revision") });
      break;
    case 3:
      fields.push({ no: 7, bytes: bytesOf(c.value ?? Buffer.alloc(0)) });
      break;
    default:
      fields.push({ no: 8, varint: int64(c.lease, "compare lease") });
  }
  if (c.range_end !== undefined && c.range_end.length > 0) fields.push({ no: 64, bytes: c.range_end });
  return message(fields);
}

function requestOpMessage(op: IRequestOp): Message {
  const set = [op.request_range, op.request_put, op.request_delete_range, op.request_txn].filter((x) => x !== undefined && x !== null).length;
  if (set !== 1) throw new TypeError(`a request op must set exactly one request, got ${set}`);
  if (op.request_put) {
    const p = op.request_put;
    const fields: Field[] = [];
    if (p.key !== undefined) fields.push({ no: 1, bytes: bytesOf(p.key) });
    if (p.value !== undefined && p.value.length > 0) fields.push({ no: 2, bytes: bytesOf(p.value) });
    const lease = int64(p.lease, "put lease");
    if (lease !== 0) fields.push({ no: 3, varint: lease });
    if (p.prev_kv === true) fields.push({ no: 4, varint: 1 });
    if (p.ignore_value === true) fields.push({ no: 5, varint: 1 });
    if (p.ignore_lease === true) fields.push({ no: 6, varint: 1 });
    return message([{ no: 2, msg: message(fields) }]);
  }
  if (op.request_range) {
    const r = op.request_range;
    if ((r.sort_order !== undefined && r.sort_order !== "None" && r.sort_order !== 0) || (r.sort_target !== undefined && r.sort_target !== "Key" && r.sort_target !== 0)) {
      throw new TypeError("a range with a sort order is not supported on the commit path");
    }
    const fields: Field[] = [];
    if (r.key !== undefined) fields.push({ no: 1, bytes: bytesOf(r.key) });
    if (r.range_end !== undefined && r.range_end.length > 0) fields.push({ no: 2, bytes: r.range_end });
    const limit = int64(r.limit, "range limit");
    if (limit !== 0) fields.push({ no: 3, varint: limit });
    const revision = int64(r.revision, "range revision");
    if (revision !== 0) fields.push({ no: 4, varint: revision });
    if (r.serializable === true) fields.push({ no: 7, varint: 1 });
    if (r.keys_only === true) fields.push({ no: 8, varint: 1 });
    if (r.count_only === true) fields.push({ no: 9, varint: 1 });
    if (r.min_mod_revision !== undefined || r.max_mod_revision !== undefined || r.min_create_revision !== undefined || r.max_create_revision !== undefined) {
      throw new TypeError("a range with revision bounds is not supported on the commit path");
    }
    return message([{ no: 1, msg: message(fields) }]);
  }
  if (op.request_delete_range) {
    const d = op.request_delete_range;
    const fields: Field[] = [];
    if (d.key !== undefined) fields.push({ no: 1, bytes: bytesOf(d.key) });
    if (d.range_end !== undefined && d.range_end.length > 0) fields.push({ no: 2, bytes: d.range_end });
    if (d.prev_kv === true) fields.push({ no: 3, varint: 1 });
    return message([{ no: 3, msg: message(fields) }]);
  }
  throw new TypeError("a nested txn is not supported on the commit path");
}

/** A TxnRequest as one gRPC frame (prefix included). */
export function encodeTxnRequest(req: TxnRequest): Buffer {
  const fields: Field[] = [];
  for (const c of req.compare) fields.push({ no: 1, msg: compareMessage(c) });
  for (const op of req.success) fields.push({ no: 2, msg: requestOpMessage(op) });
  for (const op of req.failure) fields.push({ no: 3, msg: requestOpMessage(op) });
  return frame(message(fields));
}

/** A message as one gRPC frame: the 5-byte prefix (not compressed, big-endian length), then the message. */
function frame(msg: Message): Buffer {
  const out = Buffer.allocUnsafe(5 + msg.size);
  out[0] = 0;
  out.writeUInt32BE(msg.size, 1);
  const end = writeMessage(out, 5, msg);
  if (end !== out.length) throw new Error(`encoded ${end - 5} bytes of a ${msg.size}-byte message`);
  return out;
}

/** An empty request message (StatusRequest), framed. */
const EMPTY_MESSAGE = frame(message([]));

function writeVarint(out: Buffer, at: number, n: number | bigint): number {
  if (typeof n === "bigint") {
    while (n >= 128n) {
      out[at++] = Number(n & 127n) | 128;
      n >>= 7n;
    }
    out[at++] = Number(n);
    return at;
  }
  while (n >= 128) {
    out[at++] = (n % 128) | 128;
    n = Math.floor(n / 128);
  }
  out[at++] = n;
  return at;
}

function writeMessage(out: Buffer, at: number, msg: Message): number {
  for (const f of msg.fields) {
    if ("varint" in f) {
      at = writeVarint(out, at, f.no << 3);
      at = writeVarint(out, at, f.varint);
    } else if ("bytes" in f) {
      at = writeVarint(out, at, (f.no << 3) | 2);
      at = writeVarint(out, at, f.bytes.length);
      at += f.bytes.copy(out, at);
    } else {
      at = writeVarint(out, at, (f.no << 3) | 2);
      at = writeVarint(out, at, f.msg.size);
      at = writeMessage(out, at, f.msg);
    }
  }
  return at;
}

// --- protobuf decoding -------------------------------------------------------------------------

/** Reads fields of one message in buf[start, end). */
class Reader {
  constructor(
    private readonly buf: Buffer,
    private at: number,
    private readonly end: number,
  ) {}

  done(): boolean {
    return this.at >= this.end;
  }

  /** The next field's number and wire type. */
  tag(): { no: number; type: number } {
    const t = this.varint();
    return { no: Math.floor(t / 8), type: t % 8 };
  }

  /** An unsigned varint (exact up to 2^53; larger values, etcd's random member ids, lose low bits). */
  varint(): number {
    let n = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.at >= this.end) throw new Error("a varint runs past the end of its message");
      const b = this.buf[this.at++]!;
      n += (b & 127) * mul;
      if (b < 128) return n;
      mul *= 128;
    }
    throw new Error("a varint is longer than 10 bytes");
  }

  /** An unsigned varint as a decimal string, exact over all 64 bits (etcd's ids and leases; revisions alike). */
  uvarintString(): string {
    const start = this.at;
    const n = this.varint();
    if (this.at - start <= 7) return String(n);
    let big = 0n;
    for (let i = this.at - 1; i >= start; i--) big = (big << 7n) | BigInt(this.buf[i]! & 127);
    return big.toString();
  }

  /** A length-delimited field's bytes (a view of the response). */
  bytes(): Buffer {
    const len = this.varint();
    if (this.at + len > this.end) throw new Error("a field runs past the end of its message");
    const b = this.buf.subarray(this.at, this.at + len);
    this.at += len;
    return b;
  }

  /** A sub-message's reader. */
  sub(): Reader {
    const b = this.bytes();
    return new Reader(b, 0, b.length);
  }

  skip(type: number): void {
    if (type === 0) this.varint();
    else if (type === 2) this.bytes();
    else if (type === 1) this.at += 8;
    else if (type === 5) this.at += 4;
    else throw new Error(`unsupported wire type ${type}`);
    if (this.at > this.end) throw new Error("a field runs past the end of its message");
  }
}

function decodeHeader(r: Reader): ITxnResponse["header"] {
  const h = { cluster_id: "0", member_id: "0", revision: "0", raft_term: "0" };
  while (!r.done()) {
    const { no, type } = r.tag();
    if (type !== 0) r.skip(type);
    else if (no === 1) h.cluster_id = r.uvarintString();
    else if (no === 2) h.member_id = r.uvarintString();
    else if (no === 3) h.revision = r.uvarintString();
    else if (no === 4) h.raft_term = r.uvarintString();
    else r.skip(type);
  }
  return h;
}

function decodeKeyValue(r: Reader): IKeyValue {
  const kv = { key: Buffer.alloc(0), create_revision: "0", mod_revision: "0", version: "0", value: Buffer.alloc(0), lease: "0" };
  while (!r.done()) {
    const { no, type } = r.tag();
    if (no === 1 && type === 2) kv.key = Buffer.from(r.bytes());
    else if (no === 5 && type === 2) kv.value = Buffer.from(r.bytes());
    else if (type !== 0) r.skip(type);
    else if (no === 2) kv.create_revision = r.uvarintString();
    else if (no === 3) kv.mod_revision = r.uvarintString();
    else if (no === 4) kv.version = r.uvarintString();
    else if (no === 6) kv.lease = r.uvarintString();
    else r.skip(type);
  }
  return kv as IKeyValue;
}

function decodeResponseOp(r: Reader): IResponseOp {
  let op: Partial<IResponseOp> = {};
  while (!r.done()) {
    const { no, type } = r.tag();
    if (type !== 2) {
      r.skip(type);
      continue;
    }
    const m = r.sub();
    if (no === 1) {
      const rr = { header: decodeHeader(new Reader(Buffer.alloc(0), 0, 0)), kvs: [] as IKeyValue[], more: false, count: "0" };
      while (!m.done()) {
        const f = m.tag();
        if (f.no === 1 && f.type === 2) rr.header = decodeHeader(m.sub());
        else if (f.no === 2 && f.type === 2) rr.kvs.push(decodeKeyValue(m.sub()));
        else if (f.no === 3 && f.type === 0) rr.more = m.varint() !== 0;
        else if (f.no === 4 && f.type === 0) rr.count = m.uvarintString();
        else m.skip(f.type);
      }
      op = { response_range: rr };
    } else if (no === 2) {
      let header = decodeHeader(new Reader(Buffer.alloc(0), 0, 0));
      while (!m.done()) {
        const f = m.tag();
        if (f.no === 1 && f.type === 2) header = decodeHeader(m.sub());
        else m.skip(f.type);
      }
      op = { response_put: { header } as IResponseOp["response_put"] };
    } else if (no === 3) {
      const dr = { header: decodeHeader(new Reader(Buffer.alloc(0), 0, 0)), deleted: "0", prev_kvs: [] as IKeyValue[] };
      while (!m.done()) {
        const f = m.tag();
        if (f.no === 1 && f.type === 2) dr.header = decodeHeader(m.sub());
        else if (f.no === 2 && f.type === 0) dr.deleted = m.uvarintString();
        else if (f.no === 3 && f.type === 2) dr.prev_kvs.push(decodeKeyValue(m.sub()));
        else m.skip(f.type);
      }
      op = { response_delete_range: dr };
    } else if (no === 4) {
      throw new Error("a nested txn response, which the commit path never asks for");
    }
  }
  return op as IResponseOp;
}

/** A TxnResponse message (without the gRPC prefix). */
export function decodeTxnResponse(buf: Buffer): ITxnResponse {
  const r = new Reader(buf, 0, buf.length);
  const res: ITxnResponse = { header: decodeHeader(new Reader(buf, 0, 0)), succeeded: false, responses: [] };
  while (!r.done()) {
    const { no, type } = r.tag();
    if (no === 1 && type === 2) res.header = decodeHeader(r.sub());
    else if (no === 2 && type === 0) res.succeeded = r.varint() !== 0;
    else if (no === 3 && type === 2) res.responses.push(decodeResponseOp(r.sub()));
    else r.skip(type);
  }
  return res;
}

/** The TTL of a LeaseKeepAliveResponse (header 1, ID 2, TTL 3: int64, two's complement when negative). */
export function decodeKeepAliveTtl(buf: Buffer): number {
  const r = new Reader(buf, 0, buf.length);
  let ttl = 0;
  while (!r.done()) {
    const { no, type } = r.tag();
    if (no === 3 && type === 0) ttl = Number(BigInt.asIntN(64, BigInt(r.uvarintString())));
    else r.skip(type);
  }
  return ttl;
}

/** The leader of a StatusResponse (field 4, uint64; "0": none known). */
export function decodeStatusLeader(buf: Buffer): { readonly leader: string } {
  const r = new Reader(buf, 0, buf.length);
  let leader = "0";
  while (!r.done()) {
    const { no, type } = r.tag();
    if (no === 4 && type === 0) leader = r.uvarintString();
    else r.skip(type);
  }
  return { leader };
}
