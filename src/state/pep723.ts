/**
 * PEP 723 inline script metadata: the `# /// script` comment block a script cell must carry, and the
 * simple PEP 440 `requires-python` specifiers it may state.
 *
 * The block grammar follows the PEP's reference regex exactly: an opening line `# /// TYPE` (TYPE of
 * ASCII letters, digits and hyphens), then lines that are `#` alone or start with `# `, closed by the
 * last `# ///` line of that run of comment lines. The content (each line without its `# ` or `#`
 * prefix) is TOML. Two `script` blocks are an error; an opening `# /// script` line without a closing
 * `# ///` is an error too (as in uv), where the PEP's regex would silently find nothing.
 *
 * Pure: no I/O, no clock. Imports nothing of ours.
 */
import { parse as parseToml, TomlError } from "smol-toml";

/** What a `# /// script` block declares. */
export interface Pep723Block {
  /** The `requires-python` specifier, e.g. `>=3.11`, or null when the block does not state one. */
  readonly requiresPython: string | null;
  /** The `dependencies` (PEP 508 strings), in order; empty when the block does not state them. */
  readonly dependencies: readonly string[];
}

/** The outcome of `parsePep723`: a block, no block (`block: null`), or the problem in words. */
export type Pep723Result = { readonly ok: true; readonly block: Pep723Block | null } | { readonly ok: false; readonly reason: string };

const OPEN = /^# \/\/\/ ([a-zA-Z0-9-]+)$/;
const CLOSE = "# ///";

function isContentLine(line: string): boolean {
  return line === "#" || line.startsWith("# ");
}

/**
 * Finds and reads the `# /// script` block of `source`. Returns `{ok: true, block: null}` when the
 * source has none, `{ok: true, block}` for one valid block, and `{ok: false, reason}` (a sentence
 * naming the line and the problem) for two blocks, an unclosed block, TOML that does not parse,
 * `dependencies` that is not an array of strings, or `requires-python` that is not a valid specifier.
 * CRLF line endings are accepted. Never throws. Linear in the length of `source`; `stats.lineVisits`
 * (optional) counts the lines the scan looked at, so tests can check that bound without a clock.
 */
export function parsePep723(source: string, stats?: { lineVisits: number }): Pep723Result {
  const lines = source.replace(/\r\n/g, "\n").split("\n");
  // The PEP's regex needs a line break after the opening line and after each content line; the last
  // line of the file has none unless the source ends with "\n" (then split yields a final "").
  const last = lines.length - 1;
  // One backward pass: for each content line, the last "# ///" line of the run of content lines that
  // starts there (-1: none). Each opening line then finds its block in O(1), so the whole parse is
  // linear in the number of lines (a rescan per opening line was quadratic on hostile input).
  const closeFrom = new Int32Array(lines.length + 1).fill(-1);
  for (let j = last; j >= 0; j--) {
    if (stats) stats.lineVisits++;
    if (!isContentLine(lines[j]!)) continue;
    const later = j < last ? closeFrom[j + 1]! : -1;
    closeFrom[j] = later !== -1 ? later : lines[j] === CLOSE ? j : -1;
  }
  const blocks: { open: number; close: number }[] = [];
  let i = 0;
  while (i < lines.length) {
    if (stats) stats.lineVisits++;
    const m = OPEN.exec(lines[i]!);
    if (m === null || i === last) {
      if (m !== null && m[1] === "script") return { ok: false, reason: unclosed(i) };
      i += 1;
      continue;
    }
    const close = closeFrom[i + 1]!;
    if (close === -1) {
      if (m[1] === "script") return { ok: false, reason: unclosed(i) };
      i += 1;
      continue;
    }
    if (m[1] === "script") blocks.push({ open: i, close });
    i = close + 1;
  }
  if (blocks.length === 0) return { ok: true, block: null };
  if (blocks.length > 1) {
    const at = blocks.map((b) => `line ${b.open + 1}`).join(" and ");
    return { ok: false, reason: `there are ${blocks.length} "# /// script" blocks (at ${at}); PEP 723 allows exactly one` };
  }
  const { open, close } = blocks[0]!;
  const content = lines
    .slice(open + 1, close)
    .map((l) => (l.startsWith("# ") ? l.slice(2) : l.slice(1)))
    .join("\n");
  return readBlock(content, open);
}

function unclosed(line: number): string {
  return `the "# /// script" block opened on line ${line + 1} is never closed: end it with a line "# ///", and start every line in between with "#" or "# "`;
}

function readBlock(content: string, open: number): Pep723Result {
  let table: Record<string, unknown>;
  try {
    table = parseToml(content) as Record<string, unknown>;
  } catch (err) {
    if (err instanceof TomlError) {
      const first = err.message.split("\n")[0] ?? "invalid TOML";
      return { ok: false, reason: `the "# /// script" block is not valid TOML (line ${open + 1 + err.line}): ${first}` };
    }
    return { ok: false, reason: `the "# /// script" block is not valid TOML: ${String(err)}` };
  }
  const deps = table["dependencies"];
  let dependencies: string[] = [];
  if (deps !== undefined) {
    if (!Array.isArray(deps) || !deps.every((d) => typeof d === "string")) {
      return { ok: false, reason: `"dependencies" in the "# /// script" block must be an array of strings, like dependencies = ["httpx==0.28.1"]` };
    }
    dependencies = [...(deps as string[])];
  }
  const rp = table["requires-python"];
  let requiresPython: string | null = null;
  if (rp !== undefined) {
    if (typeof rp !== "string") {
      return { ok: false, reason: `"requires-python" in the "# /// script" block must be a string, like requires-python = ">=3.11"` };
    }
    const spec = parseSpecifier(rp);
    if (!spec.ok) return { ok: false, reason: `"requires-python" = ${JSON.stringify(rp)} is not a valid version specifier: ${spec.reason}` };
    requiresPython = rp;
  }
  const tool = table["tool"];
  if (tool !== undefined && (typeof tool !== "object" || tool === null || Array.isArray(tool))) {
    return { ok: false, reason: `"tool" in the "# /// script" block must be a table` };
  }
  return { ok: true, block: { requiresPython, dependencies } };
}

// ---------------------------------------------------------------------------------------------
// requires-python: simple PEP 440 specifiers

/** A PEP 440 comparison operator. */
export type Operator = "~=" | "==" | "!=" | "<=" | ">=" | "<" | ">" | "===";

/** One clause of a specifier: `>=3.11` is `{op: ">=", text: "3.11", release: [3, 11], wildcard: false}`. */
export interface Clause {
  readonly op: Operator;
  readonly text: string;
  readonly release: readonly number[];
  readonly wildcard: boolean;
}

const CLAUSE = /^(~=|===|==|!=|<=|>=|<|>)\s*(\S+)$/;
const RELEASE = /^v?(\d+(?:\.\d+)*)$/;

/**
 * Parses a comma-separated PEP 440 specifier (`>=3.11`, `>=3.10,<3.13`, `==3.11.*`, `~=3.11`).
 * Versions are release numbers only (no epochs, pre-, post- or dev-releases); `.*` only with `==` and
 * `!=`; `~=` needs at least two components. An empty specifier matches every version.
 */
export function parseSpecifier(spec: string): { ok: true; clauses: readonly Clause[] } | { ok: false; reason: string } {
  const clauses: Clause[] = [];
  if (spec.trim() === "") return { ok: true, clauses };
  for (const raw of spec.split(",")) {
    const part = raw.trim();
    const m = CLAUSE.exec(part);
    if (m === null) return { ok: false, reason: `"${part}" is not an operator (~=, ==, !=, <=, >=, <, >, ===) followed by a version` };
    const op = m[1] as Operator;
    const text = m[2]!;
    if (op === "===") {
      clauses.push({ op, text, release: [], wildcard: false });
      continue;
    }
    const wildcard = text.endsWith(".*");
    if (wildcard && op !== "==" && op !== "!=") return { ok: false, reason: `"${part}": a ".*" suffix is only allowed with == and !=` };
    const v = RELEASE.exec(wildcard ? text.slice(0, -2) : text);
    if (v === null) return { ok: false, reason: `"${part}": "${text}" is not a release version like 3.11 or 3.11.4` };
    const release = v[1]!.split(".").map(Number);
    if (op === "~=" && release.length < 2) return { ok: false, reason: `"${part}": ~= needs at least two components, like ~=3.11` };
    clauses.push({ op, text, release, wildcard });
  }
  return { ok: true, clauses };
}

function compare(a: readonly number[], b: readonly number[]): number {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  return 0;
}

function prefixEqual(version: readonly number[], prefix: readonly number[]): boolean {
  return prefix.every((p, i) => (version[i] ?? 0) === p);
}

function matches(c: Clause, version: readonly number[], versionText: string): boolean {
  switch (c.op) {
    case "===":
      return versionText === c.text;
    case "==":
      return c.wildcard ? prefixEqual(version, c.release) : compare(version, c.release) === 0;
    case "!=":
      return c.wildcard ? !prefixEqual(version, c.release) : compare(version, c.release) !== 0;
    case "<=":
      return compare(version, c.release) <= 0;
    case ">=":
      return compare(version, c.release) >= 0;
    case "<":
      return compare(version, c.release) < 0;
    case ">":
      return compare(version, c.release) > 0;
    case "~=":
      return compare(version, c.release) >= 0 && prefixEqual(version, c.release.slice(0, -1));
  }
}

/**
 * True when Python `version` (e.g. `3.11.4`; a suffix after the release numbers, as in `3.12.0rc1`,
 * is ignored) satisfies every clause of `spec`. Throws a TypeError naming the problem when `spec` or
 * `version` is not valid (see `parseSpecifier`; admission refuses such specifiers, so a spec read
 * from an admitted script never throws).
 */
export function satisfiesRequiresPython(spec: string, version: string): boolean {
  const parsed = parseSpecifier(spec);
  if (!parsed.ok) throw new TypeError(`invalid requires-python specifier ${JSON.stringify(spec)}: ${parsed.reason}`);
  const v = /^\s*v?(\d+(?:\.\d+)*)/.exec(version);
  if (v === null) throw new TypeError(`invalid Python version ${JSON.stringify(version)}: expected release numbers like 3.11.4`);
  const release = v[1]!.split(".").map(Number);
  return parsed.clauses.every((c) => matches(c, release, version.trim()));
}
