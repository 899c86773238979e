/**
 * The other OS process of the two-process conformance cases (two-process.ts starts it). It creates
 * the adapter's Storage by importing `module` and calling `module[exportName](config)`, prints one
 * JSON object per line on stdout, and obeys commands on stdin, one per line.
 *
 * Role "owner": opens NAME (taking ownership), commits BATCHES batches of two events (printing each
 * receipt with its identities), prints {"ready": true}, then:
 *   watch   start watching; every signal is printed as {"signal": ...}
 *   commit  commit one more event; prints {"receipt": ...} or {"error": {...}}
 *   loop    commit batches of two events until killed, printing each receipt
 *   exit    close and exit 0
 * Role "visitor": never opens; prints {"ready": true}, then:
 *   post ID  posts a message; prints {"posted": ID} or {"error": {...}}
 *   read     reads through a reader; prints {"head": N, "identities": [...]}
 *   exit     exit 0
 *
 * Usage: node [loader flags] child.js '{"module": ..., "exportName": ..., "config": ..., "name": ..., "role": ..., "batches": N}'
 */
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import type { Storage } from "../contract.js";
import { inbox, message, sessionCreated } from "./fixtures.js";

interface ChildArgs {
  readonly module: string;
  readonly exportName: string;
  readonly config: unknown;
  readonly name: string;
  readonly role: "owner" | "visitor";
  readonly batches: number;
}

const say = (line: unknown) => process.stdout.write(`${JSON.stringify(line)}\n`);
const errorLine = (err: unknown) => {
  const e = err as { name?: string; code?: string; action?: string; reason?: string; message?: string };
  return { error: { name: e.name, code: e.code, action: e.action, reason: e.reason, message: e.message ?? String(err) } };
};

async function main(args: ChildArgs): Promise<void> {
  const url = args.module.startsWith("file:") ? args.module : pathToFileURL(args.module).href;
  const create = ((await import(url)) as Record<string, unknown>)[args.exportName];
  if (typeof create !== "function") throw new Error(`${args.module} has no function export "${args.exportName}"`);
  const storage = (await (create as (config: unknown) => Storage | Promise<Storage>)(args.config)) as Storage;

  if (args.role === "visitor") {
    say({ ready: true });
    for await (const line of createInterface({ input: process.stdin })) {
      const [command, arg] = line.trim().split(/\s+/, 2);
      if (command === "post") {
        try {
          await storage.post(args.name, message(arg ?? "from-child"));
          say({ posted: arg });
        } catch (err) {
          say(errorLine(err));
        }
      } else if (command === "read") {
        try {
          const reader = await storage.reader(args.name);
          say({ head: await reader.head(), identities: (await reader.read()).map((e) => e.identity) });
          await reader.close();
        } catch (err) {
          say(errorLine(err));
        }
      } else if (command === "exit") break;
    }
    await storage.close();
    return;
  }

  const db = await storage.open(args.name);
  say({ opened: db.epoch });
  for (let i = 0; i < args.batches; i++) {
    const events = i === 0 ? [sessionCreated("child"), inbox("child", "c0")] : [inbox("child", `c${i}-a`), inbox("child", `c${i}-b`)];
    say({ receipt: await db.commit(events), identities: events.map((e) => e.identity) });
  }
  say({ ready: true });
  let late = 0;
  for await (const line of createInterface({ input: process.stdin })) {
    const command = line.trim();
    if (command === "watch") {
      db.watch((signal) => say({ signal }));
      say({ watching: true });
    } else if (command === "commit") {
      try {
        say({ receipt: await db.commit([inbox("child", `late-${late++}`)]) });
      } catch (err) {
        say(errorLine(err));
      }
    } else if (command === "loop") {
      for (let i = 0; ; i++) {
        const events = [inbox("child", `loop-${i}-a`), inbox("child", `loop-${i}-b`)];
        say({ receipt: await db.commit(events), identities: events.map((e) => e.identity) });
      }
    } else if (command === "exit") break;
  }
  await db.close();
  await storage.close();
}

const raw = process.argv[2];
try {
  if (raw === undefined) throw new Error("usage: child.js '<json arguments>'");
  await main(JSON.parse(raw) as ChildArgs);
  process.exit(0);
} catch (err) {
  say({ fatal: err instanceof Error ? err.message : String(err) });
  process.exit(1);
}
