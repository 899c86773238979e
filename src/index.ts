/**
 * Cairn's public API: the Harness, the Storage contract and its errors, the Model contract, the State
 * schema and the event vocabulary. Adapters are their own entry points:
 * `cairn/storage-adapters/memory`, `cairn/storage-adapters/sqlite`, `cairn/storage-adapters/replicated`.
 */
export { VERSION } from "./version.js";
export { Harness, type HarnessOpenOptions, type StartOptions, type RunOutcome, type HarnessStatus } from "./harness/harness.js";
export type { HarnessFaultPoint, HarnessFaults } from "./harness/core.js";
export { defaultLimits, HarnessLimits } from "./harness/options.js";
export { summarize, type Inspection, type SessionSummary } from "./harness/inspect.js";
export type { OutsideObservation } from "./harness/observations.js";
export { CairnError, ConfigError, type ErrorCode } from "./errors.js";
export * from "./storage/contract.js";
export * from "./storage/errors.js";
export { ModelError, type Model, type ModelReply, type ModelRequest } from "./model/contract.js";
export { createModel } from "./model/providers.js";
export { ScriptedModel } from "./model/scripted.js";
export * from "./state/schema.js";
export * from "./state/events.js";
export { admit, type Admission, type AdmissionContext, type Receipt, type RejectionCode } from "./state/admission.js";
export { applyAccepted } from "./state/apply.js";
export { Reducer, reduce } from "./state/reducer.js";
export { Metrics } from "./observability/metrics.js";
export { createLogger } from "./observability/logger.js";
export { startObservabilityServer } from "./observability/server.js";
