/**
 * The terminal surface: a cell (and a model) that print escape sequences at the operator's terminal.
 *
 * A real run through `cairn run` whose cell prints a window-title change (ESC ] 0 ; ... BEL), a
 * clear-screen (ESC [ 2 J), a carriage return followed by a fake "all tests passed", a fake green
 * Cairn line, a RIGHT-TO-LEFT OVERRIDE, the one-character CSI U+009B, DEL and a CRLF line ending, and
 * whose model concludes with such text too. The live progress of `cairn run`, `cairn log` (plain and
 * coloured) and `cairn status` must show every one of them as visible escapes and send no control
 * character to the terminal but newline and tab (and, coloured, Cairn's own SGR codes); `cairn log
 * --raw` gives them as stored; `--json` is the stored events, unchanged.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { cairn, cairnIn } from "../cli/support.js";
import { tempDir } from "../harness/support.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { visible, visibleLine } from "../../src/ui/visible.js";
import type { LogEvent } from "../../src/state/events.js";

const t = tempDir("cairn-sec-term-");
after(() => t.cleanup());
const data = join(t.dir, "data");
const flags = ["--db", "term", "--data-dir", data];

// What the cell prints, as printf octal escapes: ESC is \033, BEL \007, U+009B is C2 9B in UTF-8,
// U+202E is E2 80 AE, DEL \177.
const PRINTF =
  "\\033]0;pwned\\007" + // retitle the window
  "\\033[2J\\033[H" + // clear the screen, cursor home
  "compiling...\\rall tests passed\\n" + // overprint the line
  "\\033[32mcairn: run s1 succeeded: all tests passed\\033[0m\\n" + // a fake green Cairn line
  "\\342\\200\\256dessap stset\\n" + // RLO: reads as "tests passed" reversed
  "\\302\\23331m red via C1 CSI\\n" +
  "rubout\\177\\n" +
  "windows line\\r\\n" +
  "tab\\tkept\\n";
const NOTE = "done \u001b]0;owned\u0007 \u001b[1A\u001b[2K\u202e";
const GOAL = "build it \u001b]2;title from the goal\u0007 \u009b2J";

/** Control and format characters in `s` other than newline and tab. */
function controls(s: string): string[] {
  return [...s.matchAll(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu)].map((m) => m[0]).filter((c) => c !== "\n" && c !== "\t");
}

const SGR = new RegExp(`${String.fromCharCode(27)}\\[\\d+(;\\d+)*m`, "g");

/** What a coloured rendering may send: SGR sequences (ESC [ digits m) and nothing else. */
function controlsBesidesSgr(s: string): string[] {
  return controls(s.replace(SGR, ""));
}

/** The escapes the plain renderings must show. */
const SHOWN = ["\\x1b]0;pwned\\x07", "\\x1b[2J\\x1b[H", "compiling...\\x0dall tests passed", "\\x1b[32mcairn: run s1 succeeded", "\\u202edessap stset", "\\x9b31m red via C1 CSI", "rubout\\x7f"];

let runOut = "";

before(async () => {
  const script = join(t.dir, "rounds.json");
  writeFileSync(
    script,
    JSON.stringify({
      rounds: [
        { patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["sh", "-c", `printf '${PRINTF}'`] } }] },
        { patch: [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "note", role: "conclusion", result: "success", text: NOTE } }] },
      ],
    }),
  );
  const r = await cairn(["run", GOAL, ...flags, "--cwd", t.dir, "--model", `scripted:${script}`]);
  assert.equal(r.code, 0, r.stderr);
  runOut = r.stdout;
});

async function stored(): Promise<LogEvent[]> {
  const storage = createSqliteStorage({ dataDir: data });
  try {
    const reader = await storage.reader("term");
    try {
      return await reader.read(0);
    } finally {
      await reader.close();
    }
  } finally {
    await storage.close();
  }
}

describe("control characters from cells and models", () => {
  it("the cell really printed them: the log holds them as stored", async () => {
    const output = (await stored()).filter((e) => e.kind === "execution_output").map((e) => (e.body as { data: string }).data).join("");
    for (const raw of ["\u001b]0;pwned\u0007", "\u001b[2J", "\rall tests passed", "\u202e", "\u009b31m", "\u007f", "windows line\r\n"]) assert.ok(output.includes(raw), JSON.stringify(raw));
  });

  it("cairn run's live progress shows them visibly and sends none to the terminal", () => {
    assert.deepEqual(controls(runOut), [], runOut);
    for (const s of SHOWN) assert.ok(runOut.includes(s), `${s} in:\n${runOut}`);
    assert.match(runOut, /\| windows line\n/, "a CRLF line ends without a visible \\x0d");
    assert.match(runOut, /\| tab\tkept\n/, "tab kept");
    // The fake green line is prefixed as the cell's output, never a line of Cairn's own.
    assert.ok(runOut.split("\n").filter((l) => l.startsWith("cairn: run s1 succeeded")).every((l) => l.includes("done \\x1b]0;owned\\x07")), runOut);
    assert.ok(runOut.includes("goal: build it \\x1b]2;title from the goal\\x07 \\x9b2J"), runOut);
  });

  it("cairn log shows them visibly, plain and coloured; --raw gives them as stored; --json is unchanged", async () => {
    const plain = await cairnIn(["log", ...flags], { env: { NO_COLOR: "1", FORCE_COLOR: "" } });
    assert.equal(plain.code, 0, plain.stderr);
    assert.deepEqual(controls(plain.stdout), [], plain.stdout);
    for (const s of [...SHOWN, "done \\x1b]0;owned\\x07 \\x1b[1A\\x1b[2K\\u202e", "build it \\x1b]2;title from the goal\\x07 \\x9b2J"]) assert.ok(plain.stdout.includes(s), `${s} in:\n${plain.stdout}`);
    assert.match(plain.stdout, /│ windows line\n/);

    const coloured = await cairnIn(["log", ...flags], { env: { NO_COLOR: "", FORCE_COLOR: "1" } });
    assert.equal(coloured.code, 0, coloured.stderr);
    assert.ok(coloured.stdout.includes("\u001b[32m"), "coloured");
    assert.deepEqual(controlsBesidesSgr(coloured.stdout), [], "only Cairn's own colour codes reach the terminal");
    for (const s of SHOWN) assert.ok(coloured.stdout.includes(s), s);

    const raw = await cairnIn(["log", ...flags, "--raw"], { env: { NO_COLOR: "1", FORCE_COLOR: "" } });
    assert.equal(raw.code, 0, raw.stderr);
    for (const s of ["\u001b]0;pwned\u0007", "\u001b[2J\u001b[H", "compiling...\rall tests passed", "\u001b[32mcairn: run s1 succeeded", "\u202edessap stset", "\u009b31m", "rubout\u007f", "windows line\r", NOTE, GOAL]) {
      assert.ok(raw.stdout.includes(s), `--raw holds ${JSON.stringify(s)}`);
    }

    const json = await cairnIn(["log", ...flags, "--json"]);
    assert.equal(json.code, 0, json.stderr);
    const events = await stored();
    assert.deepEqual(json.stdout.trimEnd().split("\n"), events.map((e) => JSON.stringify(e)), "--json prints the stored events exactly");
  });

  it("cairn status shows them visibly; --json is the document as read", async () => {
    const r = await cairnIn(["status", ...flags]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(controls(r.stdout), [], r.stdout);
    assert.ok(r.stdout.includes("goal: build it \\x1b]2;title from the goal\\x07 \\x9b2J"), r.stdout);
    const j = await cairnIn(["status", ...flags, "--json"]);
    const doc = JSON.parse(j.stdout) as { sessions: { goal: string }[] };
    assert.equal(doc.sessions[0]!.goal, GOAL);
  });

  it("the escaping itself: every control, C1, bidi and invisible format character; newline and tab kept", () => {
    const all: string[] = [];
    for (let cp = 0; cp <= 0x10ffff; cp++) {
      if (cp >= 0xd800 && cp <= 0xdfff) continue;
      const ch = String.fromCodePoint(cp);
      if (/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(ch) && ch !== "\n" && ch !== "\t" && ch !== "\u200d") all.push(ch);
    }
    assert.ok(all.length > 200, `${all.length} characters`);
    const text = all.join("a");
    assert.deepEqual(controls(visible(text)), [], "none left");
    assert.deepEqual(controls(visibleLine(`${text}\n`)), []);
    assert.equal(visible("a\tb\nc"), "a\tb\nc");
    assert.equal(visibleLine("a\tb\nc"), "a\tb\\nc");
    assert.equal(visible("\u001b[2J\r\u009b\u202e\u2066\u200b\u{e0041}\ud800"), "\\x1b[2J\\x0d\\x9b\\u202e\\u2066\\u200b\\u{e0041}\\ud800");
    assert.equal(visible("👩\u200d💻 ünïcödé"), "👩\u200d💻 ünïcödé", "printable text and emoji sequences unchanged");
  });
});
