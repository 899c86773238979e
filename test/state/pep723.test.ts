import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { parsePep723, parseSpecifier, satisfiesRequiresPython } from "../../src/state/pep723.js";

const lines = (...l: string[]) => l.join("\n");

function ok(source: string) {
  const r = parsePep723(source);
  if (!r.ok) assert.fail(`expected a valid block, got: ${r.reason}`);
  return r.block;
}

function bad(source: string, ...mentions: string[]): string {
  const r = parsePep723(source);
  assert.equal(r.ok, false, "expected a parse problem");
  if (r.ok) throw new Error("unreachable");
  for (const m of mentions) assert.ok(r.reason.includes(m), `reason should mention ${JSON.stringify(m)}: ${r.reason}`);
  return r.reason;
}

describe("parsePep723: blocks", () => {
  test("the PEP's example", () => {
    const src = lines("# /// script", '# requires-python = ">=3.12"', '# dependencies = ["httpx==0.28.1"]', "# ///", "", "import httpx", "print(httpx.get('https://example.com').status_code)");
    assert.deepEqual(ok(src), { requiresPython: ">=3.12", dependencies: ["httpx==0.28.1"] });
  });
  test("multi-line arrays, bare # lines, a [tool] table, after a shebang", () => {
    const src = lines("#!/usr/bin/env -S uv run --script", "# /// script", "# dependencies = [", '#   "requests<3",', '#   "rich",', "# ]", "#", "# [tool.uv]", "# exclude-newer = \"2024-01-01T00:00:00Z\"", "# ///", "print(1)");
    assert.deepEqual(ok(src), { requiresPython: null, dependencies: ["requests<3", "rich"] });
  });
  test("no block at all", () => {
    assert.equal(ok("print('hello')\n"), null);
    assert.equal(ok(""), null);
  });
  test("a block of another TYPE is not a script block", () => {
    assert.equal(ok(lines("# /// pyproject", '# name = "x"', "# ///", "print(1)")), null);
  });
  test("an indented or differently spaced opener is not a block", () => {
    assert.equal(ok(lines("  # /// script", '  # dependencies = []', "  # ///")), null);
    assert.equal(ok(lines("#/// script", "# dependencies = []", "#///")), null);
  });
  test("CRLF line endings", () => {
    assert.deepEqual(ok("# /// script\r\n# requires-python = \">=3.11\"\r\n# ///\r\nprint(1)\r\n"), { requiresPython: ">=3.11", dependencies: [] });
  });
  test("the block closes at the last # /// of its run of comment lines (PEP precedence)", () => {
    // The PEP's own example: "# ///" lines inside a TOML multi-line string do not close the block.
    const src = lines("# /// script", '# embedded-csharp = """', "# /// <summary>", "# /// text", "# ///", "# /// </summary>", "# public class MyClass { }", '# """', '# requires-python = ">=3.10"', "# ///", "", "print(1)");
    assert.deepEqual(ok(src), { requiresPython: ">=3.10", dependencies: [] });
  });
  test("a non-comment line ends the run", () => {
    const src = lines("# /// script", "# dependencies = []", "# ///", "x = 1", "# ///");
    assert.deepEqual(ok(src), { requiresPython: null, dependencies: [] });
  });
  test("two script blocks are an error naming both lines", () => {
    const src = lines("# /// script", "# dependencies = []", "# ///", "x = 1", "# /// script", "# dependencies = []", "# ///");
    bad(src, "2", "line 1", "line 5", "exactly one");
  });
  test("an unclosed block is an error", () => {
    bad(lines("# /// script", "# dependencies = []", "print(1)"), "line 1", "never closed");
    bad("# /// script", "never closed");
  });
  test("bad TOML is an error naming the source line", () => {
    bad(lines("# /// script", "# dependencies = []", "# requires-python = >=3.11", "# ///"), "not valid TOML", "line 3");
  });
  test("dependencies must be an array of strings", () => {
    bad(lines("# /// script", '# dependencies = "httpx"', "# ///"), "dependencies", "array of strings");
    bad(lines("# /// script", "# dependencies = [1]", "# ///"), "array of strings");
  });
  test("requires-python must be a valid specifier string", () => {
    bad(lines("# /// script", "# requires-python = 3.11", "# ///"), "requires-python", "string");
    bad(lines("# /// script", '# requires-python = "python3"', "# ///"), "not a valid version specifier");
  });
});

describe("satisfiesRequiresPython", () => {
  const cases: [string, string, boolean][] = [
    [">=3.11", "3.11.4", true],
    [">=3.12", "3.11.9", false],
    [">=3.10,<3.13", "3.12.1", true],
    [">=3.10, <3.12", "3.12.0", false],
    ["<=3.11", "3.11.0", true],
    ["<=3.11", "3.11.1", false],
    [">3.11", "3.11.0", false],
    [">3.11", "3.11.1", true],
    ["<3.11", "3.10.14", true],
    ["==3.11", "3.11.0", true],
    ["==3.11", "3.11.2", false],
    ["==3.11.*", "3.11.7", true],
    ["==3.11.*", "3.12.0", false],
    ["!=3.11.*", "3.12.0", true],
    ["!=3.11.*", "3.11.3", false],
    ["!=3.11.2", "3.11.3", true],
    ["~=3.11", "3.12.0", true],
    ["~=3.11", "4.0", false],
    ["~=3.11.2", "3.11.5", true],
    ["~=3.11.2", "3.12.0", false],
    ["~=3.11.2", "3.11.1", false],
    ["", "3.11.4", true],
    [">=3.11", "3.12.0rc1", true],
  ];
  for (const [spec, version, want] of cases) {
    test(`${JSON.stringify(spec)} ${want ? "accepts" : "refuses"} ${version}`, () => {
      assert.equal(satisfiesRequiresPython(spec, version), want);
    });
  }
  test("invalid specifiers and versions throw a TypeError naming the problem", () => {
    assert.throws(() => satisfiesRequiresPython(">=3.11.*", "3.11.0"), /only allowed with == and !=/);
    assert.throws(() => satisfiesRequiresPython("~=3", "3.11.0"), /at least two components/);
    assert.throws(() => satisfiesRequiresPython("3.11", "3.11.0"), /not an operator/);
    assert.throws(() => satisfiesRequiresPython(">=3.11", "python"), /invalid Python version/);
  });
  test("parseSpecifier reports clauses", () => {
    const r = parseSpecifier(">=3.10, <3.13");
    assert.ok(r.ok);
    assert.deepEqual(
      r.clauses.map((c) => c.op),
      [">=", "<"],
    );
  });
});

describe("parsePep723: linear on hostile input", () => {
  // Counted, never timed: the number of lines the scan looks at must grow linearly with the input.
  const visits = (src: string) => {
    const stats = { lineVisits: 0 };
    parsePep723(src, stats);
    return stats.lineVisits;
  };
  const adversarial = [
    (n: number) => Array.from({ length: n }, () => "# /// a").join("\n") + "\n",
    (n: number) => Array.from({ length: n }, (_, i) => (i % 2 === 0 ? "# /// x" : "# ///x")).join("\n") + "\n",
    (n: number) => "# /// script\n" + Array.from({ length: n }, () => "# /// b").join("\n") + "\n# ///\n",
  ];
  test("block-opener lines up to the script size limit are scanned a bounded number of times each", () => {
    for (const make of adversarial) {
      const src = make(Math.floor(262_144 / 8));
      assert.ok(src.length <= 262_144 + 32);
      const lines = src.split("\n").length;
      const v = visits(src);
      assert.ok(v <= 3 * lines, `${v} line visits for ${lines} lines: the scan is not linear`);
    }
  });
  test("doubling the input at most doubles the work", () => {
    for (const make of adversarial) {
      const a = visits(make(4000));
      const b = visits(make(8000));
      assert.ok(b <= 2.1 * a, `work went from ${a} to ${b} when the input doubled`);
    }
  });
  test("the linear scan finds the same blocks", () => {
    assert.equal(parsePep723(adversarial[0]!(100)).ok, true);
    const r = parsePep723(adversarial[2]!(50));
    assert.equal(r.ok, false); // the content is not TOML
    assert.deepEqual(parsePep723("# /// script\n# /// x\n# ///\n# ///\nprint(1)\n").ok, false);
  });
});
