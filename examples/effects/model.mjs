// Prints the scripted model of the effect-ledger demo (examples/effects/demo.sh): round 0 runs
// open-pr.py; round 1 (after the crash left it an UnknownExecution) resolves that cell and runs the
// script again as a new cell; round 2 concludes. Usage: node model.mjs open-pr.py > model.json
import { readFileSync } from "node:fs";

const source = readFileSync(process.argv[2] ?? new URL("./open-pr.py", import.meta.url), "utf8");
const test = (value) => ({ op: "test", path: "/revision", value });
const add = (value) => ({ op: "add", path: "/cells/-", value });
const script = (id) => ({ id, previous_id: null, kind: "script", source });
const rounds = [
  { note: "run the script", patch: [test(0), add(script(1))] },
  {
    note: "the worker died while the script ran: its effects say what is left; run it again",
    patch: [
      test(1),
      add({ id: 2, previous_id: null, kind: "note", role: "resolution", target_cell_id: 1, evidence_refs: ["cell:1"], text: "open-pr is done (the ledger holds its result); notify-team was never begun: running the script again makes only what is left" }),
      add(script(3)),
    ],
  },
  { note: "conclude", patch: [test(2), add({ id: 4, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "the pull request was opened once and the team told once" })] },
];
process.stdout.write(JSON.stringify({ rounds }, null, 2) + "\n");
