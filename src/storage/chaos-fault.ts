/**
 * Test-only storage fault hook from the environment: `CAIRN_CHAOS_STORAGE_FAULT=POINT@N[,POINT@N...]`
 * makes the N-th time (counting from 1) this process's storage reaches fault point POINT throw, so
 * that a chaos run can lose an acknowledgement (`commit:after-durable`: the commit is durable but the
 * caller is told it failed) or fail a commit before anything is written (`commit:before`) in a real
 * `cairn` process. Unset or empty (production): no hook, no cost.
 */
import { ConfigError } from "../errors.js";
import type { FaultHook, FaultPoint } from "./contract.js";

const POINTS: readonly FaultPoint[] = ["commit:before", "commit:after-durable"];

/** The hook CAIRN_CHAOS_STORAGE_FAULT asks for, or undefined when it is unset. Throws ConfigError on a bad value. */
export function storageFaultsFromEnv(env: NodeJS.ProcessEnv): FaultHook | undefined {
  const spec = env.CAIRN_CHAOS_STORAGE_FAULT;
  if (spec === undefined || spec.trim() === "") return undefined;
  const remaining = new Map<FaultPoint, number[]>();
  for (const part of spec.split(",")) {
    const [point, nth] = part.trim().split("@");
    if (point === undefined || !POINTS.includes(point as FaultPoint)) {
      throw new ConfigError(`CAIRN_CHAOS_STORAGE_FAULT: "${part}" names no fault point; use ${POINTS.join(" or ")} followed by @N (the N-th time it is reached).`);
    }
    const n = Number(nth);
    if (!Number.isInteger(n) || n < 1) throw new ConfigError(`CAIRN_CHAOS_STORAGE_FAULT: "${part}" needs @N with N a positive whole number.`);
    remaining.set(point as FaultPoint, [...(remaining.get(point as FaultPoint) ?? []), n]);
  }
  const seen = new Map<FaultPoint, number>();
  return (point) => {
    const count = (seen.get(point) ?? 0) + 1;
    seen.set(point, count);
    if (remaining.get(point)?.includes(count)) throw new Error(`chaos: injected storage fault at ${point} #${count} (CAIRN_CHAOS_STORAGE_FAULT)`);
  };
}
