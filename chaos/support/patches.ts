/**
 * Patches a scripted model answers with, and scripted model files. Every patch starts with the
 * revision test, as the scripted model's format requires (round i answers revision i).
 */
import { writeFileSync } from "node:fs";

type Op = Record<string, unknown>;

const test = (revision: number): Op => ({ op: "test", path: "/revision", value: revision });
const add = (cell: Record<string, unknown>): Op => ({ op: "add", path: "/cells/-", value: cell });

/** Adds one cmd cell `id` running `argv` (no shell unless argv asks for one). */
export function cmdPatch(revision: number, id: number, argv: readonly string[]): Op[] {
  return [test(revision), add({ id, previous_id: null, kind: "cmd", argv: [...argv] })];
}

/** A conclusion note `id`. */
export function concludePatch(revision: number, id: number, result: "success" | "failure", text: string): Op[] {
  return [test(revision), add({ id, previous_id: null, kind: "note", role: "conclusion", result, text })];
}

/** A resolution note `id` for cell `target` citing `evidence`, optionally followed by more cells. */
export function resolvePatch(revision: number, id: number, target: number, evidence: readonly string[], then: readonly Record<string, unknown>[] = []): Op[] {
  return [
    test(revision),
    add({ id, previous_id: null, kind: "note", role: "resolution", target_cell_id: target, evidence_refs: [...evidence], text: `checked what cell ${target} did` }),
    ...then.map(add),
  ];
}

/** Writes a scripted model file with these rounds (round i must test revision i). */
export function writeScript(file: string, rounds: readonly Op[][]): void {
  writeFileSync(file, JSON.stringify({ rounds: rounds.map((patch) => ({ patch })) }, null, 2));
}
