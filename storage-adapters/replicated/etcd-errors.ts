/**
 * The one place etcd client errors become Cairn errors. Classification is by the etcd3 client's
 * error classes (it already maps gRPC status codes and etcd's server messages onto them); the few
 * etcd server conditions without a class are recognised by etcd's fixed `etcdserver:` message.
 */
import {
  ClientClosedError,
  EtcdAuthenticationFailedError,
  EtcdInvalidAuthTokenError,
  EtcdPermissionDeniedError,
  GRPCAbortedError,
  GRPCCancelledError,
  GRPCDeadlineExceededError,
  GRPCInternalError,
  GRPCResourceExhastedError,
  GRPCUnauthenticatedError,
  GRPCUnavailableError,
  GRPCUnknownError,
  ClientRuntimeError,
} from "etcd3";
import { CairnError, ConfigError } from "../../src/errors.js";
import { StorageRejected, StorageUnavailable } from "../../src/storage/errors.js";
import { ROOT_PREFIX } from "./layout.js";

/**
 * What an etcd error means for us:
 * - `outage`: no answer (member down, no quorum, deadline): the request may or may not have applied.
 * - `denied`: the user's role lacks permission. `auth`: bad or missing credentials.
 * - `too_large`: etcd refused the request's size or operation count; nothing applied.
 * - `tls`: the TLS handshake failed (certificates or scheme); no request was sent.
 * - `closed`: our own client was closed. `other`: anything else (a bug or a misconfiguration).
 */
export type EtcdErrorKind = "outage" | "denied" | "auth" | "too_large" | "tls" | "closed" | "other";

/** Which side of a failed TLS handshake is at fault, from the TLS library's message (gRPC wraps it in UNAVAILABLE). */
export type TlsProblem = "client_cert" | "server_cert" | "not_tls";

const TLS_PROBLEMS: readonly (readonly [TlsProblem, RegExp])[] = [
  // The server's alert: it refused our client certificate, or we sent none.
  ["client_cert", /alert (bad certificate|certificate required|unknown ca|certificate unknown|certificate expired|certificate revoked|unsupported certificate)/i],
  // Our verification of the server's certificate.
  ["server_cert", /unable to verify the first certificate|self[- ]signed certificate|unable to get (local )?issuer certificate|Hostname\/IP does not match certificate|certificate has expired|ERR_TLS_CERT_ALTNAME_INVALID|certificate is not yet valid/i],
  // https to a member that serves plain http.
  ["not_tls", /wrong version number|packet length too long/i],
];

/** The TLS handshake problem an etcd client error reports, or null when it is not one. */
export function tlsProblemOf(err: unknown): TlsProblem | null {
  if (!(err instanceof Error)) return null;
  for (const [problem, re] of TLS_PROBLEMS) if (re.test(err.message)) return problem;
  return null;
}

/** Classifies an error thrown by the etcd3 client. */
export function classifyEtcdError(err: unknown): EtcdErrorKind {
  if (!(err instanceof Error)) return "other";
  if (err instanceof EtcdPermissionDeniedError) return "denied";
  if (err instanceof EtcdAuthenticationFailedError || err instanceof GRPCUnauthenticatedError || err instanceof EtcdInvalidAuthTokenError) return "auth";
  const msg = err.message;
  if (msg.includes("etcdserver: user name is empty") || msg.includes("etcdserver: invalid auth")) return "auth";
  if (msg.includes("etcdserver: request is too large") || msg.includes("etcdserver: too many operations in txn request") || msg.includes("larger than max")) {
    return "too_large";
  }
  if (err instanceof ClientClosedError) return "closed";
  if (tlsProblemOf(err) !== null) return "tls";
  if (
    err instanceof GRPCUnavailableError ||
    err instanceof GRPCDeadlineExceededError ||
    err instanceof GRPCCancelledError ||
    err instanceof GRPCUnknownError ||
    err instanceof GRPCInternalError ||
    err instanceof GRPCResourceExhastedError ||
    err instanceof GRPCAbortedError ||
    err instanceof ClientRuntimeError ||
    // cockatiel (the client's fault handling) marks its errors with flags, not classes we can import.
    (err as { isBrokenCircuitError?: boolean }).isBrokenCircuitError === true ||
    (err as { isTaskCancelledError?: boolean }).isTaskCancelledError === true ||
    msg.includes("etcdserver: request timed out") ||
    msg.includes("etcdserver: no leader") ||
    msg.includes("etcdserver: leader changed") ||
    msg.includes("etcdserver: too many requests")
  ) {
    return "outage";
  }
  return "other";
}

/** What the caller was doing, for the message. */
export interface EtcdErrorContext {
  /** A verb phrase: "open", "commit to", "read", "post to", "list". */
  readonly op: string;
  /** The database name, when there is one. */
  readonly db?: string;
  /** The etcd user, when authenticating (never the password). */
  readonly user?: string;
  readonly endpoints: readonly string[];
}

/**
 * Maps an etcd3 client error to a Cairn error with a message saying what to do. Cairn errors pass
 * through unchanged. Outages become StorageUnavailable (retryable); permission and credential
 * problems ConfigError; size limits StorageRejected `too_large`.
 */
export function mapEtcdError(err: unknown, ctx: EtcdErrorContext): CairnError {
  if (err instanceof CairnError) return err;
  const what = ctx.db === undefined ? ctx.op : `${ctx.op} database "${ctx.db}"`;
  const who = ctx.user === undefined ? "the anonymous etcd user" : `etcd user "${ctx.user}"`;
  const detail = err instanceof Error ? err.message : String(err);
  switch (classifyEtcdError(err)) {
    case "denied": {
      const prefix = ctx.db === undefined ? ROOT_PREFIX : `${ROOT_PREFIX}${ctx.db}/`;
      return new ConfigError(
        `${who} may not ${what}: its etcd role does not grant readwrite on the key prefix ${prefix} ` +
          `(grant it with \`etcdctl role grant-permission <role> --prefix=true readwrite ${prefix}\`, see deploy/etcd/README.md)`,
        { cause: err },
      );
    }
    case "auth":
      return new ConfigError(
        `etcd refused the credentials of ${who} while trying to ${what}: check CAIRN_ETCD_USER / CAIRN_ETCD_PASSWORD (or the username/password options)`,
        { cause: err },
      );
    case "tls":
      return new ConfigError(`cannot ${what}: the TLS handshake with etcd at ${ctx.endpoints.join(",")} failed: ${tlsAdvice(tlsProblemOf(err))} (${detail.split("\n")[0]})`, {
        cause: err,
      });
    case "too_large":
      return new StorageRejected("too_large", `etcd refused the request to ${what} as too large (${detail}); nothing was written`, { cause: err });
    case "closed":
      return new StorageUnavailable(`cannot ${what}: this storage was closed`, { cause: err });
    case "outage":
      return new StorageUnavailable(
        `cannot ${what}: the etcd cluster at ${ctx.endpoints.join(",")} does not answer with a quorum (${detail}); retry when a majority of members is back`,
        { cause: err },
      );
    default:
      return new CairnError("internal", `unexpected etcd error while trying to ${what}: ${detail}`, { cause: err });
  }
}

function tlsAdvice(problem: TlsProblem | null): string {
  switch (problem) {
    case "client_cert":
      return "the members refused our client certificate or got none; set tls.cert and tls.key (or CAIRN_ETCD_CERT / CAIRN_ETCD_KEY) to a client certificate signed by the CA the members trust (their --trusted-ca-file)";
    case "server_cert":
      return "the members' certificate could not be verified; set tls.ca (or CAIRN_ETCD_CA) to the CA that signed it, and check it is valid for the endpoint's host name or IP";
    default:
      return "the members do not serve TLS on these endpoints; use http:// endpoints without tls, or enable client TLS on the members";
  }
}
