/**
 * OutputCapture on its own: UTF-8 split anywhere, the byte limit with its marker, batching without
 * concurrent calls, and an onOutput failure surfacing from finish().
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { OutputCapture, truncationMarker, utf8CutPoint } from "../../src/exec/output.js";
import { collector } from "./helpers.js";

describe("OutputCapture", () => {
  test("a multi-byte text split at every byte offset decodes whole", async () => {
    const text = "a€b𝄞c é\n";
    const bytes = Buffer.from(text, "utf8");
    for (let cut = 0; cut <= bytes.length; cut++) {
      const out = collector();
      const cap = new OutputCapture({ limitBytes: 1000, flushIntervalMs: 0, onOutput: out.onOutput });
      cap.start();
      cap.push("stdout", bytes.subarray(0, cut));
      await new Promise((r) => setTimeout(r, 5)); // let a flush happen between the two halves
      cap.push("stdout", bytes.subarray(cut));
      await cap.finish();
      assert.equal(out.text("stdout"), text, `cut at ${cut}`);
      assert.ok(!out.calls.flat().some((c) => c.data.includes("\uFFFD")), `no replacement char at cut ${cut}`);
      assert.equal(cap.outputBytes, bytes.length);
    }
  });

  test("past the limit bytes are dropped, counted, never split a character, and the marker says so", async () => {
    const out = collector();
    const cap = new OutputCapture({ limitBytes: 5, flushIntervalMs: 0, onOutput: out.onOutput });
    cap.start();
    cap.push("stdout", Buffer.from("ab€€", "utf8")); // 2 + 3 + 3 = 8 bytes; 5 fit exactly "ab€"
    cap.push("stderr", Buffer.from("more", "utf8"));
    await cap.finish();
    assert.equal(out.text("stdout"), "ab€");
    assert.equal(cap.outputBytes, 5);
    assert.equal(cap.droppedBytes, 3 + 4);
    assert.equal(out.text("stderr"), `\n${truncationMarker(5, 7)}`);
    assert.match(out.text("stderr"), /\[cairn: output truncated after 5 bytes; 7 bytes dropped\]/);
    assert.equal(utf8CutPoint(Buffer.from("a€", "utf8"), 2), 1);
    assert.equal(utf8CutPoint(Buffer.from("a€", "utf8"), 4), 4);
  });

  test("under the limit there is no marker", async () => {
    const out = collector();
    const cap = new OutputCapture({ limitBytes: 5, flushIntervalMs: 0, onOutput: out.onOutput });
    cap.push("stdout", Buffer.from("12345"));
    await cap.finish();
    assert.equal(cap.droppedBytes, 0);
    assert.equal(out.text("stderr"), "");
  });

  test("a slow onOutput is never called concurrently and writes are batched", async () => {
    const out = collector(30);
    const cap = new OutputCapture({ limitBytes: 1 << 20, flushIntervalMs: 10, onOutput: out.onOutput });
    cap.start();
    for (let i = 0; i < 200; i++) {
      cap.push(i % 2 === 0 ? "stdout" : "stderr", Buffer.from(`${i}\n`));
      if (i % 20 === 0) await new Promise((r) => setTimeout(r, 15));
    }
    await cap.finish();
    assert.equal(out.maxConcurrent(), 1);
    assert.ok(out.calls.length > 1 && out.calls.length < 200, `calls: ${out.calls.length}`);
    const evens = Array.from({ length: 100 }, (_, k) => `${2 * k}\n`).join("");
    assert.equal(out.text("stdout"), evens);
  });

  test("an onOutput failure stops delivery and is rethrown by finish()", async () => {
    let calls = 0;
    const boom = new Error("commit failed");
    const cap = new OutputCapture({
      limitBytes: 100,
      flushIntervalMs: 0,
      onOutput: async () => {
        calls++;
        throw boom;
      },
    });
    cap.push("stdout", Buffer.from("x"));
    await new Promise((r) => setTimeout(r, 10));
    cap.push("stdout", Buffer.from("y"));
    await assert.rejects(cap.finish(), (err) => err === boom);
    assert.equal(calls, 1);
  });
});
