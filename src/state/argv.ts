/**
 * Linux limits on what `execve` takes (MAX_ARG_STRLEN: 32 pages, 128 KiB per string with its NUL) and
 * a total well under ARG_MAX (usually 2 MiB, shared with the environment). An argv past them could
 * never start, so admission refuses it, where the model can still fix it.
 *
 * Pure: no I/O.
 */
export const MAX_ARG_BYTES = 128 * 1024 - 1;
export const MAX_ARGV_TOTAL_BYTES = 1024 * 1024;

/** What makes `argv` impossible to start, in words a model can act on; null when nothing does. */
export function argvProblem(argv: readonly string[]): string | null {
  let total = 0;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.includes("\0")) {
      return `argv[${i}] contains a NUL character (\\u0000), which no program can receive as an argument; remove it (to pass binary data, write it to a file from a script cell)`;
    }
    const bytes = Buffer.byteLength(a, "utf8");
    if (bytes > MAX_ARG_BYTES) {
      return `argv[${i}] is ${bytes} bytes in UTF-8, over the kernel's limit of ${MAX_ARG_BYTES} bytes per argument; write large input to a file from a script cell and pass its path`;
    }
    total += bytes + 1;
  }
  if (total > MAX_ARGV_TOTAL_BYTES) {
    return `the argv totals ${total} bytes in UTF-8, over the ${MAX_ARGV_TOTAL_BYTES} bytes a command line may take here; write large input to a file from a script cell and pass its path`;
  }
  return null;
}
