/**
 * The `cairn` command: run, resume, status, post, serve, timer, effect, cluster.
 *
 * The only place that wires concrete adapters and providers together. Every failure ends with one
 * sentence on stderr and a documented exit code (see exit.ts), never a stack trace.
 *
 * Each command's module is imported when that command runs, not before: loading every command's
 * dependencies (the model SDKs, the harness, the metrics and HTTP servers) cost `cairn --version` and
 * `cairn status` most of their time. test/cli/lazy-load.test.ts checks which modules a command loads.
 */
import { VERSION } from "../version.js";
import { EXIT, describeError } from "./exit.js";
import { UsageError } from "./args.js";

export interface Io {
  readonly out: (line: string) => void;
  readonly err: (line: string) => void;
  readonly env: NodeJS.ProcessEnv;
  /** Whether `out` is a terminal (colour, decoration); defaults to process.stdout.isTTY. */
  readonly isTTY?: boolean;
}

/** `cairn status | head`: the reader went away; stop writing quietly instead of crashing with EPIPE. */
let stdoutClosed = false;
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") stdoutClosed = true;
  else throw err;
});

const defaultIo: Io = {
  out: (line) => {
    if (!stdoutClosed) process.stdout.write(`${line}\n`);
  },
  err: (line) => process.stderr.write(`${line}\n`),
  env: process.env,
};

export const USAGE = `cairn ${VERSION}: a durable runtime for autonomous coding agents

usage:
  cairn run [GOAL] --db NAME --model SPEC [--session ID] [--cwd DIR] [--validator "CMD ARGS"]... [--json]
  cairn submit GOAL --db NAME [--session ID] [--validator "CMD ARGS"]...   (to the owning worker)
  cairn resume --db NAME --model SPEC [--json]
  cairn status --db NAME [--session ID] [--json]
  cairn log --db NAME [--session ID] [--cell N] [--follow] [--json]
  cairn post --db NAME --session ID --id ID --kind KIND --payload JSON
  cairn pause|unpause|cancel --db NAME --session ID [--reason TEXT]       (pause --now stops the running cell)
  cairn approve|deny --db NAME --session ID --cell N [--reason TEXT]     (a cell waiting for approval)
  cairn fork --db NAME --session ID --at-round N [--new-session NEW]    (a new run from round N's State)
  cairn serve --db NAME --model SPEC [--listen HOST:PORT] [--create] [--takeover]
  cairn ui --db NAME [--listen HOST:PORT]                               (the timeline page, read-only)
  cairn timer --id ID (--in DURATION | --at ISO-TIME) [--note TEXT]    (inside a running cell)
  cairn effect begin|end|key NAME [--retry] [--result JSON]            (inside a running cell)
  cairn cluster up|down|status|stop|start [MEMBER] [--dir DIR]          (a local 3-zone etcd)

Run \`cairn COMMAND --help\` for a command's flags. Exit codes: 0 success, 1 the run failed,
2 bad usage or configuration (also: a run blocked until its model key or settings are fixed),
3 fenced (another process owns the database: do not restart here), 4 storage unavailable,
5 internal error (a bug in Cairn: please report it).`;

/** Runs the command line `argv` (without node and the script) and returns the exit code. */
export async function main(argv: readonly string[], io: Io = defaultIo): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case "run":
        return await (await import("./run.js")).runCommand(rest, io);
      case "resume":
        return await (await import("./run.js")).resumeCommand(rest, io);
      case "status":
        return await (await import("./status.js")).statusCommand(rest, io);
      case "log":
        return await (await import("./log.js")).logCommand(rest, io);
      case "post":
        return await (await import("./post.js")).postCommand(rest, io);
      case "submit":
        return await (await import("./submit.js")).submitCommand(rest, io);
      case "pause":
      case "unpause":
      case "cancel":
      case "approve":
      case "deny":
        return await (await import("./steer.js")).steerCommand(command, rest, io);
      case "fork":
        return await (await import("./fork.js")).forkCommand(rest, io);
      case "serve":
        return await (await import("./serve.js")).serveCommand(rest, io);
      case "ui":
        return await (await import("./ui.js")).uiCommand(rest, io);
      case "timer":
        return await (await import("./timer.js")).timerCommand(rest, io);
      case "effect":
        return await (await import("./effect.js")).effectCommand(rest, io);
      case "cluster":
        return await (await import("./cluster.js")).clusterCommand(rest, io);
      case "--version":
      case "version":
        io.out(VERSION);
        return EXIT.ok;
      case undefined:
      case "help":
      case "--help":
      case "-h":
        io.out(USAGE);
        return command === undefined ? EXIT.usage : EXIT.ok;
      default:
        throw new UsageError(`unknown command "${command}"; the commands are run, submit, resume, status, log, post, pause, unpause, cancel, approve, deny, fork, serve, ui, timer, effect and cluster (see \`cairn --help\`).`);
    }
  } catch (err) {
    const { code, message } = describeError(err);
    io.err(`cairn: ${message}`);
    if (process.env.CAIRN_DEBUG && err instanceof Error && err.stack) io.err(err.stack);
    return code;
  }
}

/** How long the process may linger after `main` returned before it exits anyway. */
const LINGER_MS = 3000;

/**
 * Called once `main` has returned: everything was closed, so the process should end by itself. A
 * connection to a member that went silent can stay open in the gRPC library after every client was
 * closed; a fenced or cut-off owner must not hang on it: exit anyway, saying what was still open.
 */
export function exitBackstop(): void {
  setTimeout(() => {
    const open = process.getActiveResourcesInfo().filter((r) => r !== "Timeout");
    process.stderr.write(`cairn: exiting ${LINGER_MS / 1000} s after finishing although resources were still open (${open.join(", ") || "timers"}): a storage member did not answer the close.\n`);
    process.exit();
  }, LINGER_MS).unref();
}
