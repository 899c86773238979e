/**
 * A cell's environment, built from an allow-list, never from the harness's own environment minus a
 * deny-list: a secret whose name nobody thought of (GITHUB_TOKEN, ANTHROPIC_AUTH_TOKEN, a cloud key)
 * never reaches a cell unless the operator names it (`--cell-env NAME`).
 */

/** Variables every cell gets from the harness's environment, when set. */
const ALLOWED = ["PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "COLORTERM", "NO_COLOR"];
/** Prefixes allowed likewise (locale settings). */
const ALLOWED_PREFIXES = ["LC_"];
/**
 * W3C trace context (https://www.w3.org/TR/trace-context/, as environment variables): a traced
 * harness sets them in `fixed` to the cell's own span, so the cell's tools can join the trace. The
 * harness's own values name another parent, so they never pass on their own; an operator may still
 * name them (`--cell-env TRACEPARENT`) for a harness that does not trace.
 */
export const TRACE_CONTEXT = ["TRACEPARENT", "TRACESTATE"] as const;

/** The shape of a variable name an operator may pass on (`--cell-env NAME`). */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The environment of a cell: the allow-listed variables of `host`, the ones the operator named in
 * `passed` (absent ones are skipped), then `fixed` (what Cairn sets: HOME, TMPDIR, CAIRN_*, the
 * cell's TRACEPARENT), which wins over both. When `fixed` sets TRACEPARENT, TRACESTATE comes from
 * `fixed` alone: a state passed from the host belongs to another parent.
 */
export function cellEnvironment(host: NodeJS.ProcessEnv, passed: readonly string[], fixed: Readonly<Record<string, string>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(host)) {
    if (v === undefined) continue;
    if (ALLOWED.includes(k) || ALLOWED_PREFIXES.some((p) => k.startsWith(p))) out[k] = v;
  }
  for (const name of passed) {
    const v = host[name];
    if (v !== undefined) out[name] = v;
  }
  if (out.PATH === undefined) out.PATH = "/usr/local/bin:/usr/bin:/bin";
  if (fixed.TRACEPARENT !== undefined) for (const name of TRACE_CONTEXT) delete out[name];
  return { ...out, ...fixed };
}
