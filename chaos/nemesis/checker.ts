/**
 * The nemesis checker. It reads only the history (history.ts), each database's final log (read after
 * the run by a read-only reader) and the effect files the cells appended to, never the harness's own
 * state, and reports every anomaly with the history and log lines that show it:
 *
 * - acked-missing: an acknowledged commit is not in the final log at the seqs it was told, or an
 *   opening after its acknowledgement found a head below it (lost after a reopen);
 * - seq-gap / identity-duplicate: the final log's seqs are not 1..head, or an identity appears twice;
 * - double-start: a cell version with two `execution_started` events;
 * - effect-excess: more effect lines for a cell than `started` executions of it; effect-lost: a cell
 *   that finished with exit code 0 left no line (neither an effect line nor a ledger answer that the
 *   effect was done or found);
 * - the effect ledger (cells ask `cairn effect begin` before making their effect and record the
 *   answer on a `ledger` line): effect-twice, an effect of a run made more than once (its line twice,
 *   whichever cells wrote it); proceed-after-done, a `proceed` answered for an effect after a `done`
 *   was; done-without-end, a `done` answered for an effect the run's final log never ended (an
 *   answer from nowhere, or from another run's ledger); proceed-not-durable, a `proceed` answered to
 *   a cell whose begin of that effect is not in the final log (answered before it was durable);
 * - effect-after-newer-owner: an effect line (or a long cell's `tick` line) written by an owner's cell
 *   after a newer owner's first `execution_started` was acknowledged (the old cell outlived the
 *   takeover);
 * - stale-epoch-commit: an event above the head a newer opener found, committed only by older epochs
 *   (a commit that landed after a newer epoch was claimed); phantom-event: an event no worker sent;
 * - run-not-ended: a run without exactly one `run_ended`; submitted-run-missing: a submitted request
 *   without its run;
 * - floor: too little acknowledged work, or no effect made and no `proceed` answered by the ledger (a
 *   schedule where everything failed, where no cell could start, or where no cell reached the ledger,
 *   proves nothing).
 *
 * Timestamps compared (effect lines against acknowledgements) come from one machine's clock, and each
 * is taken on the safe side: a cell stamps its line before writing it, a worker records an
 * acknowledgement after the commit is durable. Everything else is ordered by the history file's order.
 */
import type { HEvent, HRecord } from "./history.js";

/** The fields of a final log event the checker reads. */
export interface FinalEvent {
  readonly seq: number;
  readonly kind: string;
  readonly identity: string;
  readonly session: string;
  readonly body: { readonly cell_id?: number; readonly exit_code?: number | null; readonly result?: string; readonly goal?: string; readonly name?: string };
}

export interface Floor {
  readonly ackedCommits: number;
  readonly successfulRuns: number;
  /** Effects the cells must have made (1 unless told): none means no cell ran, and every effect check held vacuously. */
  readonly effectLines?: number;
  /** `proceed`s the ledger must have answered the cells (0 unless told): none means the ledger checks held vacuously. */
  readonly proceeds?: number;
}

export interface Anomaly {
  readonly check: string;
  readonly db: string;
  readonly message: string;
  /** The history records (with their line numbers, 1-based) and log events that show it. */
  readonly excerpt: string[];
}

export interface Verdict {
  readonly anomalies: Anomaly[];
  readonly stats: {
    readonly commits: Record<"acknowledged" | "refused" | "uncertain", number>;
    readonly runs: Record<"success" | "failure" | "unfinished", number>;
    readonly opens: number;
    readonly fences: number;
    readonly exits: Record<string, number>;
    readonly faults: Record<string, number>;
    readonly posts: Record<string, number>;
    readonly effectLines: number;
    /** Effect lines that are neither ticks nor ledger answers: effects the cells made. */
    readonly effectsMade: number;
    /** What `cairn effect begin` answered the cells, by first word (refusals as `refused-<exit code>`; `found` when a cell found an uncertain effect done). */
    readonly ledger: Record<string, number>;
  };
}

export interface CheckInput {
  readonly history: readonly HRecord[];
  /** Final log of each database, by name. */
  readonly finals: ReadonlyMap<string, readonly FinalEvent[]>;
  /** Lines of each database's effect file, by database name (missing file: no entry or empty). */
  readonly effects: ReadonlyMap<string, readonly string[]>;
  readonly floor: Floor;
}

const line = (i: number, r: HRecord) => `history:${i + 1} ${JSON.stringify(r)}`;
const ev = (e: FinalEvent) => `log seq ${e.seq}: ${e.kind} ${e.identity}`;

export function check(input: CheckInput): Verdict {
  const { history, finals, effects, floor } = input;
  const anomalies: Anomaly[] = [];
  const add = (a: Anomaly) => anomalies.push({ ...a, excerpt: a.excerpt.slice(0, 12) });

  const invokes = new Map<string, { i: number; r: Extract<HRecord, { type: "invoke" }> }>();
  const key = (db: string, worker: string, op: number) => `${db}\u0000${worker}\u0000${op}`;
  const commits = { acknowledged: 0, refused: 0, uncertain: 0 };
  const answered = new Set<string>();
  const exits: Record<string, number> = {};
  const faults: Record<string, number> = {};
  const posts: Record<string, number> = {};
  let opens = 0;
  let fences = 0;
  history.forEach((r, i) => {
    if (r.type === "invoke") invokes.set(key(r.db, r.worker, r.op), { i, r });
    if (r.type === "ok" || r.type === "fail") answered.add(key(r.db, r.worker, r.op));
    if (r.type === "ok") commits.acknowledged += 1;
    if (r.type === "fail") commits[r.outcome] += 1;
    if (r.type === "open") opens += 1;
    if (r.type === "fenced") fences += 1;
    if (r.type === "exit") {
      const k = r.signal !== null ? r.signal : `code ${r.code}`;
      exits[k] = (exits[k] ?? 0) + 1;
    }
    if (r.type === "fault" && r.phase === "begin") faults[r.kind] = (faults[r.kind] ?? 0) + 1;
    if (r.type === "post") posts[r.outcome] = (posts[r.outcome] ?? 0) + 1;
  });
  for (const [k] of invokes) if (!answered.has(k)) commits.uncertain += 1;

  const dbs = new Set<string>([...finals.keys()]);
  for (const r of history) if ("db" in r && typeof r.db === "string") dbs.add(r.db);

  // Which epochs sent each identity, per database.
  const senders = new Map<string, Map<string, Set<number>>>();
  for (const { r } of invokes.values()) {
    let m = senders.get(r.db);
    if (m === undefined) senders.set(r.db, (m = new Map()));
    for (const e of r.events) {
      let s = m.get(e.identity);
      if (s === undefined) m.set(e.identity, (s = new Set()));
      s.add(r.epoch);
    }
  }

  let effectLines = 0;
  let effectsMade = 0;
  const ledger: Record<string, number> = {};
  const runs = { success: 0, failure: 0, unfinished: 0 };
  for (const db of [...dbs].sort()) {
    const log = finals.get(db);
    if (log === undefined) {
      add({ check: "final-log-missing", db, message: `database ${db} appears in the history but its final log was not read`, excerpt: [] });
      continue;
    }
    const bySeq = new Map(log.map((e) => [e.seq, e]));

    // seqs 1..head, identities unique
    log.forEach((e, i) => {
      if (e.seq !== i + 1) add({ check: "seq-gap", db, message: `the final log's event #${i + 1} has seq ${e.seq}`, excerpt: log.slice(Math.max(0, i - 2), i + 1).map(ev) });
    });
    const firstOf = new Map<string, FinalEvent>();
    for (const e of log) {
      const prev = firstOf.get(e.identity);
      if (prev !== undefined) add({ check: "identity-duplicate", db, message: `identity ${e.identity} is in the log twice (seqs ${prev.seq} and ${e.seq})`, excerpt: [ev(prev), ev(e)] });
      else firstOf.set(e.identity, e);
    }

    // acknowledged commits: in the log at their seqs, and within every later opening's head
    history.forEach((r, i) => {
      if (r.type !== "ok" || r.db !== db) return;
      const inv = invokes.get(key(r.db, r.worker, r.op));
      if (inv === undefined) return;
      const want = inv.r.events.map((e) => e.identity);
      const got: string[] = [];
      for (let s = r.firstSeq; s <= r.lastSeq; s++) got.push(bySeq.get(s)?.identity ?? "(missing)");
      if (want.length !== got.length || want.some((id, j) => got[j] !== id)) {
        add({
          check: "acked-missing",
          db,
          message: `commit ${r.worker}#${r.op} was acknowledged at seqs ${r.firstSeq}..${r.lastSeq} but the final log holds [${got.join(", ")}] there, not [${want.join(", ")}]`,
          excerpt: [line(inv.i, inv.r), line(i, r), ...[...Array(r.lastSeq - r.firstSeq + 1).keys()].map((k) => bySeq.get(r.firstSeq + k)).filter((e) => e !== undefined).map(ev)],
        });
      }
      for (let j = i + 1; j < history.length; j++) {
        const o = history[j]!;
        if (o.type === "open" && o.db === db && o.head >= 0 && o.epoch > r.epoch && o.head < r.lastSeq) {
          add({ check: "acked-missing", db, message: `commit ${r.worker}#${r.op} was acknowledged up to seq ${r.lastSeq}, but ${o.worker} opened later (epoch ${o.epoch}) at head ${o.head}`, excerpt: [line(i, r), line(j, o)] });
          break;
        }
      }
    });

    // one start per cell version
    const starts = new Map<string, FinalEvent[]>();
    for (const e of log) {
      if (e.kind !== "execution_started") continue;
      const k = `${e.session} ${e.body.cell_id}`;
      starts.set(k, [...(starts.get(k) ?? []), e]);
    }
    for (const [k, es] of starts) if (es.length > 1) add({ check: "double-start", db, message: `cell ${k} (session, cell) was started ${es.length} times`, excerpt: es.map(ev) });

    // effect lines: never more than starts; one for a cell that exited 0; none after a newer owner launched
    const lines = (effects.get(db) ?? []).filter((l) => l.trim() !== "");
    effectLines += lines.length;
    const perCell = new Map<string, string[]>();
    const parsed: { session: string; cell: number; epoch: number; ms: number; text: string; effect?: string }[] = [];
    const ticks: typeof parsed = [];
    const answers: (typeof parsed[number] & { effect: string; answer: string; line: number })[] = [];
    for (const [n, text] of lines.entries()) {
      const t = /^tick (\S+) (\d+) (\d+) (\d+)$/.exec(text.trim());
      if (t !== null) {
        ticks.push({ session: t[1]!, cell: Number(t[2]), epoch: Number(t[3]), ms: Number(t[4]), text });
        continue;
      }
      const l = /^ledger (\S+) (\d+) (\d+) (\d+) (\S+) (\S+)$/.exec(text.trim());
      if (l !== null) {
        answers.push({ session: l[1]!, cell: Number(l[2]), epoch: Number(l[3]), ms: Number(l[4]), text, effect: l[5]!, answer: l[6]!, line: n });
        ledger[l[6]!] = (ledger[l[6]!] ?? 0) + 1;
        continue;
      }
      const m = /^(\S+) (\d+) (\d+) (\d+)(?: (\S+))?$/.exec(text.trim());
      if (m === null) {
        add({ check: "effect-malformed", db, message: `the effect file holds a line that no cell writes: ${JSON.stringify(text)}`, excerpt: [text] });
        continue;
      }
      const p = { session: m[1]!, cell: Number(m[2]), epoch: Number(m[3]), ms: Number(m[4]), text, ...(m[5] !== undefined ? { effect: m[5] } : {}) };
      parsed.push(p);
      effectsMade++;
      const k = `${p.session} ${p.cell}`;
      perCell.set(k, [...(perCell.get(k) ?? []), text]);
    }
    for (const [k, ls] of perCell) {
      const n = starts.get(k)?.length ?? 0;
      if (ls.length > n) add({ check: "effect-excess", db, message: `cell ${k} (session, cell) wrote ${ls.length} effect lines but was started ${n} times`, excerpt: [...ls, ...(starts.get(k) ?? []).map(ev)] });
    }
    const settled = new Set(answers.filter((a) => a.answer === "done" || a.answer === "found").map((a) => `${a.session} ${a.cell}`));
    for (const e of log) {
      if (e.kind !== "execution_finished" || e.body.exit_code !== 0) continue;
      const k = `${e.session} ${e.body.cell_id}`;
      if (!perCell.has(k) && !settled.has(k)) add({ check: "effect-lost", db, message: `cell ${k} (session, cell) finished with exit code 0 but its effect line is missing (and the ledger did not tell it the effect was done)`, excerpt: [ev(e)] });
    }
    checkLedger(db, log, parsed, answers, add);
    // the first acknowledged `execution_started` of each epoch
    const firstLaunch = new Map<number, { i: number; r: Extract<HRecord, { type: "ok" }> }>();
    history.forEach((r, i) => {
      if (r.type !== "ok" || r.db !== db || firstLaunch.has(r.epoch)) return;
      const inv = invokes.get(key(r.db, r.worker, r.op));
      if (inv?.r.events.some((e: HEvent) => e.kind === "execution_started")) firstLaunch.set(r.epoch, { i, r });
    });
    const reported = new Set<string>();
    for (const p of [...parsed, ...ticks, ...answers].sort((a, b) => a.ms - b.ms)) {
      const what = `${p.session} ${p.cell} ${p.epoch}`;
      if (reported.has(what)) continue; // one anomaly per cell and owner, its first line after the takeover
      for (const [epoch, f] of firstLaunch) {
        if (epoch > p.epoch && p.ms > f.r.at) {
          reported.add(what);
          add({
            check: "effect-after-newer-owner",
            db,
            message: `cell ${p.session} ${p.cell} of the owner at epoch ${p.epoch} ${p.text.startsWith("tick") ? "was still running (a tick line)" : p.text.startsWith("ledger") ? "was still running (a ledger line)" : "wrote its effect line"} at ${p.ms}, after the owner at epoch ${epoch} launched its first cell (acknowledged at ${f.r.at})`,
            excerpt: [p.text, line(f.i, f.r)],
          });
          break;
        }
      }
    }

    // nothing above a newer opener's head from older epochs only
    const dbSenders = senders.get(db) ?? new Map<string, Set<number>>();
    for (const e of log) {
      if (!dbSenders.has(e.identity)) add({ check: "phantom-event", db, message: `log seq ${e.seq} (${e.identity}) was committed by no worker of the history`, excerpt: [ev(e)] });
    }
    history.forEach((o, j) => {
      if (o.type !== "open" || o.db !== db || o.head < 0) return;
      for (const e of log) {
        if (e.seq <= o.head) continue;
        const eps = dbSenders.get(e.identity);
        if (eps === undefined || eps.size === 0) continue;
        const newest = Math.max(...eps);
        if (newest < o.epoch) {
          add({
            check: "stale-epoch-commit",
            db,
            message: `log seq ${e.seq} (${e.identity}) was sent only by epoch ${newest}, yet it lies above the head ${o.head} that ${o.worker} found when it claimed epoch ${o.epoch}`,
            excerpt: [line(j, o), ev(e)],
          });
          return;
        }
      }
    });

    // runs end; submitted runs exist
    const ended = new Map<string, FinalEvent[]>();
    for (const e of log) if (e.kind === "run_ended") ended.set(e.session, [...(ended.get(e.session) ?? []), e]);
    const goals = new Set<string>();
    for (const e of log) {
      if (e.kind !== "session_created") continue;
      goals.add(String(e.body.goal ?? ""));
      const ends = ended.get(e.session) ?? [];
      if (ends.length !== 1) {
        runs.unfinished += 1;
        add({ check: "run-not-ended", db, message: `run ${e.session} has ${ends.length} run_ended events (one expected)`, excerpt: [ev(e), ...ends.map(ev)] });
      } else if (ends[0]!.body.result === "success") runs.success += 1;
      else runs.failure += 1;
    }
    history.forEach((r, i) => {
      if (r.type !== "submit" || r.db !== db) return;
      if (![...goals].some((g) => g.startsWith(`chaos ${r.req} `))) add({ check: "submitted-run-missing", db, message: `request ${r.req} was submitted but no run for it is in the log`, excerpt: [line(i, r)] });
    });
  }

  if (commits.acknowledged < floor.ackedCommits) add({ check: "floor", db: "*", message: `only ${commits.acknowledged} commits were acknowledged (the floor is ${floor.ackedCommits})`, excerpt: [`commits: ${JSON.stringify(commits)}`] });
  if (runs.success < floor.successfulRuns) add({ check: "floor", db: "*", message: `only ${runs.success} runs ended in success (the floor is ${floor.successfulRuns})`, excerpt: [`runs: ${JSON.stringify(runs)}`] });

  const lineFloor = floor.effectLines ?? 1;
  if (effectsMade < lineFloor) add({ check: "floor", db: "*", message: `only ${effectsMade} effects were made (${effectLines} lines in the effect files; the floor is ${lineFloor}): the cells did not run, so the effect checks proved nothing (see the execution_finished details in the final logs)`, excerpt: [`runs: ${JSON.stringify(runs)}`] });
  // A cell whose `cairn effect` failed still writes its ledger line (refused-N) and no effect.
  const proceeds = ledger.proceed ?? 0;
  if (proceeds < (floor.proceeds ?? 0)) add({ check: "floor", db: "*", message: `the ledger answered proceed ${proceeds} times (the floor is ${floor.proceeds}): the cells did not reach the ledger, so the ledger checks proved nothing`, excerpt: [`ledger answers: ${JSON.stringify(ledger)}`] });

  return { anomalies, stats: { commits, runs, opens, fences, exits, faults, posts, effectLines, effectsMade, ledger } };
}

/** The effect-ledger checks of one database (see the module comment). */
function checkLedger(
  db: string,
  log: readonly FinalEvent[],
  made: readonly { session: string; cell: number; text: string; effect?: string }[],
  answers: readonly { session: string; cell: number; text: string; effect: string; answer: string; line: number }[],
  add: (a: Anomaly) => void,
): void {
  // Made at most once per run: two lines of one effect, whichever cells wrote them.
  const lines = new Map<string, string[]>();
  for (const m of made) {
    if (m.effect === undefined) continue;
    const k = `${m.session} ${m.effect}`;
    lines.set(k, [...(lines.get(k) ?? []), m.text]);
  }
  for (const [k, ls] of lines) if (ls.length > 1) add({ check: "effect-twice", db, message: `effect ${k} (session, effect) was made ${ls.length} times`, excerpt: ls });
  // No proceed once done was answered (file order is the order the answers were recorded in).
  const doneSeen = new Map<string, (typeof answers)[number]>();
  for (const a of answers) {
    const k = `${a.session} ${a.effect}`;
    if (a.answer === "done") {
      if (!doneSeen.has(k)) doneSeen.set(k, a);
    } else if (a.answer === "proceed" && doneSeen.has(k)) {
      add({ check: "proceed-after-done", db, message: `effect ${k} (session, effect): cell ${a.cell} was answered proceed after cell ${doneSeen.get(k)!.cell} was answered done`, excerpt: [doneSeen.get(k)!.text, a.text] });
    }
  }
  // Every answer agrees with the run's final log: done only for an ended effect, proceed only for a
  // begin of that cell that is there (committed before it was answered).
  const ended = new Set(log.filter((e) => e.kind === "effect_ended").map((e) => `${e.session} ${e.body.name}`));
  const begun = new Set(log.filter((e) => e.kind === "effect_begun").map((e) => `${e.session} ${e.body.cell_id} ${e.body.name}`));
  for (const a of answers) {
    if (a.answer === "done" && !ended.has(`${a.session} ${a.effect}`)) {
      add({ check: "done-without-end", db, message: `cell ${a.session} ${a.cell} was answered done for ${a.effect}, which the run's final log never ended`, excerpt: [a.text] });
    }
    if (a.answer === "proceed" && !begun.has(`${a.session} ${a.cell} ${a.effect}`)) {
      add({ check: "proceed-not-durable", db, message: `cell ${a.session} ${a.cell} was answered proceed for ${a.effect}, but its begin is not in the final log`, excerpt: [a.text] });
    }
  }
}

/** The failure report: the seed, then each anomaly with its excerpt. */
export function report(seed: number, anomalies: readonly Anomaly[]): string {
  const out = [`nemesis: ${anomalies.length} anomalies (seed ${seed}; replay with --seed ${seed})`];
  for (const a of anomalies.slice(0, 20)) {
    out.push(`- [${a.check}] ${a.db}: ${a.message}`);
    for (const x of a.excerpt) out.push(`    ${x}`);
  }
  if (anomalies.length > 20) out.push(`  ... and ${anomalies.length - 20} more`);
  return out.join("\n");
}
