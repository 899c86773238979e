/**
 * Stages what the owner process needs where an unprivileged user can read it. The partition test
 * runs its owner as `nobody` (so iptables can cut that uid off alone), and `nobody` cannot read a
 * checkout in a private directory (root's home is mode 700). So the test copies, into a directory
 * every user can traverse: the owner's entry and every source file it imports (followed from its
 * import statements), package.json and tsconfig.json, and the installed packages those files import
 * plus tsx (with their dependencies, resolved the way Node does), all world-readable. Sources of
 * native modules (C files, object files) are left out. The staged copy runs with `node --import tsx`
 * exactly as the checkout would.
 */
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, statSync } from "node:fs";
import { builtinModules } from "node:module";
import { dirname, join, relative, resolve, sep } from "node:path";

/** Files a native package ships for building, not for running. */
const BUILD_ONLY_FILE = /\.(a|o|c|cc|cpp|h|hpp|gyp|gypi|md|map|mk)$/i;
const BUILD_ONLY_DIR = new Set(["obj", "obj.target", ".deps", "test", "tests", "docs"]);

/** Programs a module starts as processes of their own, which no import reaches (module: program). */
const PROGRAMS = new Map([["src/exec/keeper.ts", "src/exec/keeper-main.ts"]]);

/** Bare import specifiers and relative imports of one TypeScript/JavaScript source. */
function importsOf(source: string): { relative: string[]; bare: string[] } {
  const rel: string[] = [];
  const bare: string[] = [];
  const pattern = /^\s*(import|export)\s+(type\s+)?(?:[^'";]*?\sfrom\s+)?["']([^"']+)["']|\bimport\(\s*["']([^"']+)["']\s*\)/gm;
  for (const m of source.matchAll(pattern)) {
    const spec = m[3] ?? m[4];
    if (spec === undefined || m[2] !== undefined) continue; // `import type` is erased
    if (spec.startsWith(".")) rel.push(spec);
    else if (!spec.startsWith("node:") && !builtinModules.includes(spec)) bare.push(spec);
  }
  return { relative: rel, bare };
}

/** The package name of a bare specifier ("@grpc/grpc-js/build/x" -> "@grpc/grpc-js"). */
function packageName(spec: string): string {
  const parts = spec.split("/");
  return spec.startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0]!;
}

/** The directory of package `name` as Node resolves it from `fromDir` (walking up node_modules), or undefined. */
function resolvePackage(name: string, fromDir: string, root: string): string | undefined {
  for (let dir = fromDir; ; dir = dirname(dir)) {
    const candidate = join(dir, "node_modules", name);
    if (existsSync(join(candidate, "package.json"))) return candidate;
    if (dir === root || dirname(dir) === dir) return undefined;
  }
}

/** Copies a file or a directory tree, world-readable (directories and executables also world-executable). */
function copyReadable(from: string, to: string, skipBuildFiles: boolean): void {
  const real = realpathSync(from);
  const st = statSync(real);
  if (st.isDirectory()) {
    mkdirSync(to, { recursive: true, mode: 0o755 });
    chmodSync(to, 0o755);
    for (const entry of readdirSync(real)) {
      if (skipBuildFiles && (BUILD_ONLY_DIR.has(entry) || BUILD_ONLY_FILE.test(entry))) continue;
      copyReadable(join(real, entry), join(to, entry), skipBuildFiles);
    }
    return;
  }
  mkdirSync(dirname(to), { recursive: true, mode: 0o755 });
  copyFileSync(real, to);
  chmodSync(to, st.mode & 0o111 ? 0o755 : 0o644);
}

/** Makes every directory under `dir` mode 755 (recursive mkdir applied the umask to the ones it made). */
function makeTraversable(dir: string): void {
  chmodSync(dir, 0o755);
  for (const entry of readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) makeTraversable(join(dir, entry.name));
}

/**
 * Copies `entry` (a .ts file inside `repo`) and everything it needs to run under tsx into `dest`,
 * keeping paths relative to `repo`. Returns the staged entry's path.
 */
export function stageForOtherUser(repo: string, entry: string, dest: string): string {
  repo = resolve(repo);
  // Every existing directory from / down to dest must be traversable by the other user.
  for (let dir = dirname(resolve(dest)); dirname(dir) !== dir; dir = dirname(dir)) {
    if (!existsSync(dir)) continue;
    const mode = statSync(dir).mode;
    if ((mode & 0o001) === 0) {
      throw new Error(`the owner runs as another user, who cannot reach ${dest} because ${dir} is mode ${(mode & 0o777).toString(8)}; set TMPDIR to a directory every user can traverse.`);
    }
  }
  const files = new Set<string>();
  const packages = new Set<string>(["tsx"]);
  const pending = [resolve(entry)];
  while (pending.length > 0) {
    const file = pending.pop()!;
    if (files.has(file)) continue;
    files.add(file);
    const program = PROGRAMS.get(relative(repo, file));
    if (program !== undefined) pending.push(join(repo, program));
    const { relative: rel, bare } = importsOf(readFileSync(file, "utf8"));
    for (const spec of rel) {
      const target = resolve(dirname(file), spec).replace(/\.js$/, ".ts");
      if (!existsSync(target)) throw new Error(`staging ${relative(repo, entry)}: ${relative(repo, file)} imports ${spec}, which is not at ${target}`);
      pending.push(target);
    }
    for (const spec of bare) packages.add(packageName(spec));
  }
  // The cell launcher, where the sources look for it (build/ at the root, src/exec/launcher.ts).
  const launcher = join(repo, "build", "cairn-launcher");
  if (existsSync(launcher)) files.add(launcher);
  for (const file of [...files, join(repo, "package.json"), join(repo, "tsconfig.json")]) {
    if (!file.startsWith(repo + sep)) throw new Error(`staging ${relative(repo, entry)}: ${file} is outside the repository`);
    copyReadable(file, join(dest, relative(repo, file)), false);
  }

  // Packages and their dependencies, each copied to the same place under dest/node_modules.
  const copied = new Set<string>();
  const queue = [...packages].map((name) => ({ name, from: repo }));
  while (queue.length > 0) {
    const { name, from } = queue.shift()!;
    const dir = resolvePackage(name, from, repo);
    if (dir === undefined) {
      if (from === repo) throw new Error(`staging ${relative(repo, entry)}: package ${name} is not installed in ${repo}/node_modules (run npm ci)`);
      continue; // an optional dependency for another platform
    }
    if (copied.has(dir)) continue;
    copied.add(dir);
    copyReadable(dir, join(dest, relative(repo, dir)), true);
    const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { dependencies?: Record<string, string>; optionalDependencies?: Record<string, string> };
    for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies })) queue.push({ name: dep, from: dir });
  }
  makeTraversable(dest);
  return join(dest, relative(repo, resolve(entry)));
}
