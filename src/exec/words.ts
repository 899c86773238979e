/** How the executor words what happened to a process. */
/** A spawn failure in words: E2BIG and a NUL byte get a sentence that says what to change. */
export function spawnErrorWords(err: unknown): string {
  const e = err as NodeJS.ErrnoException;
  const msg = (err instanceof Error ? err.message : String(err)).slice(0, 300);
  if (e?.code === "E2BIG") return `the argument list is too long for the kernel (E2BIG: one argument over 128 KiB, or all of them with the environment over ARG_MAX); pass large input through a file`;
  if (e?.code === "ERR_INVALID_ARG_VALUE" || /null bytes/.test(msg)) return `an argument contains a NUL byte, which no program can receive (${msg})`;
  return msg;
}

/** How a process ended, as a phrase. */
export function describeExit(code: number | null, signal: string | null): string {
  return signal !== null ? `killed by ${signal}` : `exited with code ${code}`;
}

/** Milliseconds as seconds, at most three decimals and no trailing zeros. */
export function formatSeconds(ms: number): string {
  return `${Number((ms / 1000).toFixed(3))}`;
}
