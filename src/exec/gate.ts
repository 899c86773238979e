/**
 * The gate contract: what starting a cell behind a gate gives the executor (a process that runs
 * nothing until "go" is written to its stdin), independent of the launcher that implements it.
 */
import type { Socket } from "node:net";

/** How the gate's leader ended. `lost` says why the status is unknown (the launcher died). */
export interface GateExit {
  readonly code: number | null;
  readonly signal: string | null;
  readonly lost?: string;
}

/** A started gate. */
export interface GateProcess {
  readonly pid: number;
  /** The gate's stdin; "go" is written here to release it. */
  readonly stdin: Socket;
  /** Its stdout and stderr, possibly paused: the caller listens for data, then calls `resume()`. */
  readonly stdout: Socket;
  readonly stderr: Socket;
  readonly exited: Promise<GateExit>;
  /**
   * The gate's process group and start time (field 22 of /proc/PID/stat) as the native launcher read
   * them right after the gate's setsid; absent from Node's spawn (the executor reads /proc then).
   */
  readonly stat?: { readonly pgid: number; readonly startTime: string };
  /**
   * After `exited` resolved: true when the native launcher found no process of the gate's group left
   * right after it reaped the leader (nothing is left to stop). Absent, or false, when that was not
   * asked (Node's spawn, a lost status) or a process was left.
   */
  readonly groupEmptyAtExit?: () => boolean;
  /**
   * The wait status the cell's init reported on fd 3 ("X <status>"), once the gate's stdin
   * connection closed: null when nothing was reported (the gate was never released, or its init was
   * killed before its cell ended).
   */
  readonly reportedStatus: Promise<number | null>;
}

/**
 * What `start` needs: the cell's argv (program first: started only once released), the directory
 * and the exact environment.
 */
export interface GateSpawn {
  readonly argv: readonly string[];
  readonly cwd: string;
  readonly env: Readonly<Record<string, string>>;
}

/** A gate start: the process, or the error the kernel (or Node) gave, with its `code` (ENOENT, E2BIG...). */
export type GateStart = { ok: true; gate: GateProcess } | { ok: false; error: NodeJS.ErrnoException };

/** Starts a cell's argv behind a gate, in its own session; the caller releases it with "go". */
export interface GateLauncher {
  start(spec: GateSpawn): Promise<GateStart>;
}

/** Exit code of a gate that was closed without being released: nothing of the cell ran. */
export const GATE_NOT_RELEASED_EXIT = 125;
