/**
 * Helpers for harness tests: a temp project, a scripted model from inline rounds, patch builders.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ScriptedModel } from "../../src/model/scripted.js";
import type { Cell } from "../../src/state/schema.js";

export function tempDir(prefix = "cairn-test-"): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** A scripted model whose round i is `patches[i]`. */
export function scripted(patches: unknown[][]): ScriptedModel {
  return new ScriptedModel({ rounds: patches.map((patch) => ({ patch })) } as never);
}

type NewCell = Omit<Cell, "id" | "previous_id"> & Record<string, unknown>;

/** A patch at `revision` adding cells with consecutive ids from `firstId`. */
export function adds(revision: number, firstId: number, cells: NewCell[]): unknown[] {
  return [{ op: "test", path: "/revision", value: revision }, ...cells.map((c, i) => ({ op: "add", path: "/cells/-", value: { id: firstId + i, previous_id: null, ...c } }))];
}

export const cmd = (...argv: string[]): NewCell => ({ kind: "cmd", argv }) as NewCell;
export const note = (text: string, extra: Record<string, unknown> = {}): NewCell => ({ kind: "note", text, ...extra }) as NewCell;
export const conclude = (result: "success" | "failure", text = "done"): NewCell => ({ kind: "note", role: "conclusion", result, text }) as NewCell;

export function writeJson(path: string, value: unknown): void {
  writeFileSync(path, JSON.stringify(value, null, 2));
}
