/**
 * What an adapter author imports (`cairn/storage`): the Storage contract, its errors, the rules every
 * adapter shares (names, ranges, batches, identities, mailbox bounds) and the handle lifecycle
 * (guard, watchers, fenced once). An adapter imports this and `src/state`, never another adapter.
 * The conformance suite is a separate entry (`cairn/storage/conformance`) because it needs node:test.
 */
export * from "./contract.js";
export * from "./errors.js";
export * from "./handle.js";
export * from "./pid.js";
export * from "./semantics.js";
export * from "./snapshots.js";
export type { LogEvent, NewEvent } from "../state/events.js";
