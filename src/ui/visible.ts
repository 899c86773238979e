/**
 * Text from a cell or a model, made safe to print on a terminal: every character a terminal would
 * act on instead of showing is written as an escape a reader can see. Without this, a cell that
 * prints `ESC ] 0 ; title BEL` retitles the window, `ESC [ 2 J` clears the screen, and `\r` returns
 * to the start of the line to overprint Cairn's own text with a fake "success".
 *
 * Made visible: C0 controls (ESC as `\x1b`, CR as `\x0d`, ...), DEL (`\x7f`), C1 controls
 * (U+0080..U+009F, `\x9b` is a one-character CSI on some terminals), the bidirectional controls
 * (U+202E RIGHT-TO-LEFT OVERRIDE and the rest: they reorder what follows so it reads otherwise),
 * the other invisible format characters (zero-width spaces, tag characters, the BOM), line and
 * paragraph separators, and lone surrogates. Kept: tab, newline where lines are allowed, and
 * ZERO WIDTH JOINER (emoji sequences use it; it moves nothing).
 *
 * The escape is `\xHH` up to U+00FF, `\uHHHH` up to U+FFFF, `\u{HHHHH}` above. Backslashes in the
 * text are left alone: the escapes are for reading; `cairn log --raw` and `--json` give the text as
 * stored.
 */

// Cc: C0, DEL, C1. Cf: format characters (bidi controls included). Zl, Zp: U+2028, U+2029.
// Cs: lone surrogates (matched as code points under the u flag).
const UNSAFE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/gu;

const ZWJ = "\u200d";

function escape(ch: string): string {
  const cp = ch.codePointAt(0)!;
  const hex = cp.toString(16);
  if (cp <= 0xff) return `\\x${hex.padStart(2, "0")}`;
  if (cp <= 0xffff) return `\\u${hex.padStart(4, "0")}`;
  return `\\u{${hex}}`;
}

/** `text` with every control and format character visible; tab and newline kept. */
export function visible(text: string): string {
  return text.replace(UNSAFE, (ch) => (ch === "\n" || ch === "\t" || ch === ZWJ ? ch : escape(ch)));
}

/** `text` on one line: as {@link visible}, and a newline shown as `\n` too. */
export function visibleLine(text: string): string {
  return text.replace(UNSAFE, (ch) => (ch === "\t" || ch === ZWJ ? ch : ch === "\n" ? "\\n" : escape(ch)));
}

/**
 * One line of a cell's output, without its line ending: a `\r` before the newline (CRLF) is dropped,
 * every other control made visible.
 */
export function visibleOutputLine(line: string): string {
  return visibleLine(line.endsWith("\r") ? line.slice(0, -1) : line);
}

/**
 * A copy of `value` with every string in it (object keys included) passed through
 * {@link visibleLine}: for an event whose every field may come from a cell or a model.
 */
export function visibleDeep<T>(value: T): T {
  if (typeof value === "string") return visibleLine(value) as T;
  if (Array.isArray(value)) return value.map((v: unknown) => visibleDeep(v)) as T;
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) out[visibleLine(k)] = visibleDeep(v);
    return out as T;
  }
  return value;
}
