/**
 * Whether a process with this pid exists on this host, for liveness decisions only (a lease holder on
 * this host whose process is gone need not be waited for); never for safety, which is the epoch's.
 * EPERM means it exists under another uid. A pid can be reused: callers that must not mistake a new
 * process for an old one compare its start time as well.
 */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
