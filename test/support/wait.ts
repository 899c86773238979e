/**
 * Waiting in tests, in one place: `sleep`, and `until`, which polls a condition and fails with what
 * it waited for. A deadline here is a hang guard, never a speed assertion: it is long on purpose
 * (a loaded 2-core CI machine runs everything several times slower than a laptop).
 */

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** The default hang guard of `until`. */
export const UNTIL_MS = 120_000;

/**
 * Polls `check` every `everyMs` until it returns a value other than undefined, null or false, and
 * returns that value; throws "timed out waiting for WHAT" after `limitMs`. A check that throws fails
 * the wait at once (see `untilQuiet`).
 */
export async function until<T>(what: string, check: () => T | undefined | null | false | Promise<T | undefined | null | false>, limitMs = UNTIL_MS, everyMs = 100): Promise<T> {
  const end = Date.now() + limitMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== null && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (hang guard ${Math.round(limitMs / 1000)} s)`);
    await sleep(everyMs);
  }
}

/** `until` where a check that throws counts as "not yet" (a server still starting, a port not open). */
export function untilQuiet<T>(what: string, check: () => T | undefined | null | false | Promise<T | undefined | null | false>, limitMs = UNTIL_MS, everyMs = 100): Promise<T> {
  return until(
    what,
    async () => {
      try {
        return await check();
      } catch {
        return undefined;
      }
    },
    limitMs,
    everyMs,
  );
}
