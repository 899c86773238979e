/**
 * Child process for copy-owner.test.ts: opens the local copy at argv[2] as database argv[4] (id
 * argv[3]) the way an owner does (the in-use lock, then the stamp), says "held", and waits to be stopped
 * or killed.
 */
import { LocalCopy } from "../../storage-adapters/replicated/local-copy.js";

const [path, uid, name] = process.argv.slice(2) as [string, string, string];
const copy = new LocalCopy(path);
copy.holdInUse();
copy.stamp(uid, name);
process.stdout.write("held\n");
setInterval(() => undefined, 60_000);
