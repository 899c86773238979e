/**
 * What every owner handle (`Database`) shares, whatever its engine: the order in which a call is
 * refused (closed, then fenced, then poisoned) with the same errors, and its watchers (each signal
 * delivered asynchronously, never inside a storage call; `fenced` reported once; a watcher's own
 * throw never breaks the storage). Adapters keep their engine state and call these.
 */
import type { DatabaseSignal } from "./contract.js";
import { ResetError, StorageFailure } from "./errors.js";

/** The state `guardHandle` checks. */
export interface HandleStatus {
  readonly closed: boolean;
  /** `undefined` while the handle owns the database; the newer epoch (or null when unknown) once fenced. */
  readonly fencedBy: number | null | undefined;
  /** The failure that poisoned the handle (or `true`), `false`/`null` when it is usable. */
  readonly poisoned: StorageFailure | boolean | null;
}

/** The ResetError `closed` of a handle used after `close()`. */
export function closedHandle(name: string, what: "database handle" | "reader" = "database handle"): ResetError {
  return what === "reader"
    ? new ResetError("stop", "closed", `reader of "${name}" was closed.`)
    : new ResetError("stop", "closed", `database handle "${name}" was closed; open the database again to use it.`);
}

/** Throws when a call on handle `name` (claimed at `epoch`) must be refused: closed, fenced or poisoned. */
export function guardHandle(name: string, epoch: number, status: HandleStatus): void {
  if (status.closed) throw closedHandle(name);
  if (status.fencedBy !== undefined) throw ResetError.fenced(name, epoch, status.fencedBy);
  if (status.poisoned !== false && status.poisoned !== null) {
    throw new StorageFailure(
      `database handle "${name}" is poisoned by an earlier failure whose outcome is unknown; reopen and read the log.`,
      status.poisoned === true ? {} : { cause: status.poisoned },
    );
  }
}

type Listener = (signal: DatabaseSignal) => void;

/** The watchers of one handle. */
export class Watchers {
  private readonly listeners = new Set<Listener>();
  private fenceReported = false;

  /** How many listeners are watching. */
  get size(): number {
    return this.listeners.size;
  }

  /** Adds `listener`; the returned function removes it (and calls `onEmpty` when none is left). */
  add(listener: Listener, onEmpty?: () => void): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
      if (this.listeners.size === 0) onEmpty?.();
    };
  }

  /** Tells every listener, asynchronously. */
  notify(signal: DatabaseSignal): void {
    for (const listener of this.listeners) this.deliver(listener, signal);
  }

  /** Tells every listener that the handle is fenced, the first time only; true when this was the first time. */
  fenced(epoch: number | null): boolean {
    if (this.fenceReported) return false;
    this.fenceReported = true;
    this.notify({ type: "fenced", epoch });
    return true;
  }

  /** Tells one listener (a new watcher learning the current state), asynchronously. */
  deliver(listener: Listener, signal: DatabaseSignal): void {
    queueMicrotask(() => {
      if (!this.listeners.has(listener)) return;
      try {
        listener(signal);
      } catch {
        // A watcher's own bug must not break the storage; the watcher owns its errors.
      }
    });
  }

  /** Removes every listener (on close): nothing is delivered after this. */
  clear(): void {
    this.listeners.clear();
  }
}
