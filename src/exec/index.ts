/**
 * The executor layer: running cmd and script cells in their own process groups behind a launch gate,
 * capturing their output within limits, and the process identity used to find and stop survivors.
 */
export { createExecutor } from "./executor.js";
export { GATE_NOT_RELEASED_EXIT } from "./gate.js";
export type { ExecutionOutcome, Executor, ExecutorOptions, GatedLaunch, LaunchSpec, Prepared } from "./executor.js";
export {
  bootId,
  describeSurvivor,
  hostName,
  identityOf,
  processGroupOf,
  processStartTime,
  stopSurvivor,
} from "./identity.js";
export type { ProcessIdentity, SurvivorDescription, SurvivorStopResult } from "./identity.js";
export { terminateGroup } from "./group.js";
export type { GroupStopResult, TerminateGroupOptions } from "./group.js";
export { UV_HELP, scriptPath } from "./launch.js";
export type { LaunchCell } from "./launch.js";
export { truncationMarker } from "./output.js";
export type { OutputChunk } from "./output.js";
