/**
 * Secret redaction for log records. pino's path-based `redact` only covers the paths it is given
 * (`password`, `*.password`: one level deep), so Cairn instead walks each record and replaces the
 * value of any credential-like key, at any depth, and any environment-like object, with
 * {@link REDACTED}. The caller's objects are never mutated: the walk copies what it changes.
 */

/** What a redacted value is replaced with. */
export const REDACTED = "[redacted]";

// Compared after lower-casing and dropping "_" and "-": "api_key", "apiKey" and "API-KEY" all match.
const EXACT_KEYS = new Set(["key", "auth", "authorization", "proxyauthorization", "cookie", "setcookie", "credentials", "credential", "bearer", "pass", "passphrase"]);
const SUFFIXES = ["password", "passwd", "secret", "token", "apikey", "privatekey", "accesskey", "secretkey", "signingkey", "sessionkey"];
// Whole objects that hold an environment: process.env copies leak every credential of the host.
const ENV_KEYS = new Set(["env", "environment", "processenv", "envvars"]);

const MAX_DEPTH = 12;

/** True when a property named `key` holds a credential whose value must never be logged. */
export function isSecretKey(key: string): boolean {
  const k = key.toLowerCase().replace(/[-_]/g, "");
  if (EXACT_KEYS.has(k) || ENV_KEYS.has(k)) return true;
  return SUFFIXES.some((suffix) => k.endsWith(suffix));
}

function isPlainObject(value: object): boolean {
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/**
 * A copy of `value` with every credential-like key's value, and `process.env` itself wherever it
 * appears, replaced by {@link REDACTED}. Walks plain objects and arrays (cycles and depth beyond 12
 * are cut); Errors and other class instances pass through so pino's serializers still see them.
 */
export function redactSecrets(value: unknown, depth = 0, seen: WeakSet<object> = new WeakSet()): unknown {
  if (value === null || typeof value !== "object") return value;
  if (value === process.env) return REDACTED;
  if (seen.has(value)) return "[circular]";
  if (depth >= MAX_DEPTH) return "[truncated]";
  if (Array.isArray(value)) {
    seen.add(value);
    const out = value.map((item) => redactSecrets(item, depth + 1, seen));
    seen.delete(value);
    return out;
  }
  if (!isPlainObject(value)) return value;
  seen.add(value);
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) {
    out[key] = isSecretKey(key) ? REDACTED : redactSecrets(item, depth + 1, seen);
  }
  seen.delete(value);
  return out;
}
