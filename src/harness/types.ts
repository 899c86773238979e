/**
 * The Harness's options and answers.
 */
import type { Logger } from "pino";
import type { ApprovalRule } from "../state/approval.js";
import type { Budgets } from "../state/events.js";
import type { RunResult } from "../state/schema.js";
import type { Storage } from "../storage/contract.js";
import type { SnapshotPolicy } from "../storage/snapshots.js";
import type { Model } from "../model/contract.js";
import type { Metrics } from "../observability/metrics.js";
import type { Tracing } from "../observability/tracing.js";
import type { HarnessFaults } from "./core.js";
import type { HarnessLimits } from "./options.js";
import type { HarnessWorld } from "./world.js";
import type { SandboxOptions } from "./boundary.js";

export interface HarnessOpenOptions {
  readonly storage: Storage;
  /** The database name, e.g. `harness-1`. */
  readonly name: string;
  readonly model: Model;
  /**
   * Where the harness makes its private runtime directory (scripts, the cell socket): a new 0700
   * directory with a random name is made inside it and removed at close. Default: the OS temp dir.
   */
  readonly workDir?: string;
  /** How cells are contained (sandbox, network, limits, environment); see boundary.ts. Default: `auto`. */
  readonly sandbox?: SandboxOptions;
  /** Create the database when missing (default true). `cairn resume` passes false. */
  readonly create?: boolean;
  readonly world?: HarnessWorld;
  readonly logger?: Logger;
  readonly metrics?: Metrics;
  /** OpenTelemetry spans of runs, rounds, model calls, commits and cells (default: none). */
  readonly tracing?: Tracing;
  readonly limits?: Partial<HarnessLimits>;
  /** Test-only fault points (see HarnessFaults). */
  readonly faults?: HarnessFaults;
  /** Where runs submitted through the mailbox (start-request.ts) run (default: the current directory). */
  readonly submitCwd?: string;
  /** When to write projection snapshots (default DEFAULT_SNAPSHOT_POLICY); false: never. */
  readonly snapshots?: Partial<SnapshotPolicy> | false;
  /**
   * This worker's approval rules, for every run it drives besides the run's own: a cell matching
   * one waits for a person's approval before it is launched (src/state/approval.ts).
   */
  readonly approval?: readonly ApprovalRule[];
}

export interface StartOptions {
  readonly goal: string;
  /** The working directory cells and validators run in. */
  readonly cwd: string;
  /** Each validator is an argv run in `cwd` before a `success` conclusion is accepted. */
  readonly validators?: readonly (readonly string[])[];
  readonly budgets?: Budgets;
  /** A session id the caller chose (see start-request.ts for the allowed form); default: the next `sN`. */
  readonly id?: string;
  /** "host": this run's cells get the host's network (recorded in its log). Default: the worker's setting. */
  readonly cellNetwork?: "off" | "host";
  /** Cells matching one of these rules wait for a person's approval (recorded in its log). */
  readonly approval?: readonly ApprovalRule[];
}

export interface RunOutcome {
  readonly session: string;
  readonly result: RunResult;
  readonly reason: string;
}

/** "unreachable": the ownership lease was lost (cut off from the storage): stopped acting (lease.ts). */
export type HarnessStatus = "open" | "fenced" | "poisoned" | "unreachable" | "closed";
