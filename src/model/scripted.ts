/**
 * The scripted model: a JSON file of patches, replayed offline, for tests and demos.
 *
 * File format (validated): `{ "rounds": [ { "patch": [...], "note"?: "...", "fail_first_attempt"?: true }, ... ] }`.
 * Round i answers the State whose `revision` is i (the number of patches accepted so far), so a run
 * replays deterministically and a restarted run continues where it was. A refused patch does not
 * move the revision, so the same round answers again. Each patch is written literally, including its
 * first op `{"op":"test","path":"/revision","value":i}`.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import type { TokenUsage } from "../state/events.js";
import { JsonValue } from "../state/schema.js";
import { ModelError, type Model, type ModelReply, type ModelRequest } from "./contract.js";
import { renderUserMessage, SYSTEM_PROMPT } from "./prompt.js";

/** One scripted round. */
export const ScriptedRound = z.strictObject({
  /** The patch returned for this round, verbatim. */
  patch: z.array(JsonValue),
  /** A comment for the reader of the script; not sent anywhere. */
  note: z.string().optional(),
  /** Simulates a lost response: attempt 1 of a turn at this round fails with a retryable transport error. */
  fail_first_attempt: z.boolean().optional(),
});
export type ScriptedRound = z.infer<typeof ScriptedRound>;

/** A scripted model file. */
export const ScriptedScript = z.strictObject({ rounds: z.array(ScriptedRound) });
export type ScriptedScript = z.infer<typeof ScriptedScript>;

/**
 * Answers each call with the round chosen by `state.revision`. Usage is an estimate, so that usage
 * accounting is exercised offline: input tokens = characters of the system prompt and user message
 * / 4, output tokens = characters of the patch JSON / 4 (rounded up).
 */
export class ScriptedModel implements Model {
  readonly name: string;
  private readonly rounds: readonly ScriptedRound[];

  constructor(script: ScriptedScript, name = "scripted") {
    this.rounds = ScriptedScript.parse(script).rounds;
    this.name = name;
  }

  /**
   * Reads and validates a script file. Throws a not-retryable ModelError of kind `config` naming the
   * file and what is wrong (unreadable, not JSON, or the field that does not match the format).
   */
  static fromFile(file: string): ScriptedModel {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      throw new ModelError("config", `cannot read the scripted model file ${file}: ${why}`, { retryable: false, cause: err });
    }
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      throw new ModelError("config", `the scripted model file ${file} is not valid JSON: ${why}`, { retryable: false, cause: err });
    }
    const parsed = ScriptedScript.safeParse(raw);
    if (!parsed.success) {
      const issues = parsed.error.issues
        .slice(0, 5)
        .map((i) => `${i.path.length === 0 ? "(top level)" : i.path.join(".")}: ${i.message}`)
        .join("; ");
      throw new ModelError("config", `the scripted model file ${file} does not match {"rounds":[{"patch":[...],"note"?,"fail_first_attempt"?}]}: ${issues}`, {
        retryable: false,
      });
    }
    return new ScriptedModel(parsed.data, `scripted:${file}`);
  }

  /** The scripted reply for `req.state.revision`; past the end, a not-retryable `config` ModelError. */
  async step(req: ModelRequest): Promise<ModelReply> {
    const n = req.state.revision;
    const round = this.rounds[n];
    if (round === undefined) {
      throw new ModelError("config", `the scripted model has no round ${n} (${this.name} has ${this.rounds.length} rounds, chosen by State revision from 0)`, {
        retryable: false,
      });
    }
    const usage: TokenUsage = {
      input_tokens: Math.ceil((SYSTEM_PROMPT.length + renderUserMessage(req).length) / 4),
      output_tokens: Math.ceil(JSON.stringify(round.patch).length / 4),
    };
    if (round.fail_first_attempt === true && req.attempt === 1) {
      throw new ModelError("transport", `scripted round ${n}: simulated lost response on attempt 1`, { retryable: true, usage: null });
    }
    return { patch: structuredClone(round.patch), usage };
  }
}
