/**
 * The drill's images, built locally (nothing can be pulled from a registry on these machines):
 *
 * - the base, `cairn-drill-base:<hash>`: `docker import` of a root file system copied from this
 *   host's own files: /usr/bin/node, /usr/bin/etcd (Debian's), /bin/sh, sleep, date and bwrap, the shared
 *   libraries they load (from `ldd`), /tmp, a minimal /etc/passwd, and the production packages under
 *   /app/node_modules (dereferenced: a worktree's node_modules may be a symlink). The etcd
 *   containers run it.
 * - the worker, `cairn-drill-worker:<hash>`: deploy/Dockerfile built FROM that base (by
 *   testcontainers, through the Docker API), its context holding the CLI bundled by esbuild.
 *
 * Both are tagged by a hash of what went in, so a second run reuses them.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { GenericContainer } from "testcontainers";
import { KEEPER_BUNDLE } from "../../src/exec/keeper.js";

const REPO = fileURLToPath(new URL("../../", import.meta.url));

function sh(cmd: string, args: readonly string[], input?: Buffer): string {
  return execFileSync(cmd, args, { cwd: REPO, encoding: "utf8", maxBuffer: 64 << 20, ...(input ? { input } : {}), stdio: [input ? "pipe" : "ignore", "pipe", "pipe"] });
}

function which(cmd: string): string {
  return realpathSync(sh("sh", ["-c", `command -v ${cmd}`]).trim());
}

function imageExists(tag: string): boolean {
  try {
    sh("docker", ["image", "inspect", tag]);
    return true;
  } catch {
    return false;
  }
}

/** Shared libraries `bin` loads (absolute paths, symlinks kept as the paths the loader asks for). */
function libs(bin: string): string[] {
  const out: string[] = [];
  for (const line of sh("ldd", [bin]).split("\n")) {
    const m = /=>\s+(\/\S+)/.exec(line) ?? /^\s+(\/\S+)\s+\(/.exec(line);
    if (m) out.push(m[1]!);
  }
  return out;
}

/** Copies `file` (following symlinks) to the same path under `root`, and the symlink's target path too. */
function place(root: string, file: string): void {
  for (const p of new Set([file, realpathSync(file)])) {
    const dest = join(root, p);
    mkdirSync(dirname(dest), { recursive: true });
    if (!existsSync(dest)) copyFileSync(realpathSync(file), dest);
    chmodSync(dest, 0o755);
  }
}

export interface DrillImages {
  readonly base: string;
  readonly worker: string;
}

/** Builds (or finds) the base and worker images; `log` gets a line per step with its duration. */
export async function drillImages(log: (line: string) => void = () => undefined): Promise<DrillImages> {
  const work = mkdtempSync(join(tmpdir(), "cairn-drill-image-"));
  try {
    // ---- the production node_modules (dereferenced: a worktree's node_modules may be a symlink)
    const prod = sh("npm", ["ls", "--omit=dev", "--all", "--parseable"])
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l !== "" && l !== REPO.replace(/\/$/, ""));
    const nm = join(REPO, "node_modules");
    const tops = new Set<string>();
    for (const p of prod) {
      const rel = relative(nm, p);
      if (rel.startsWith("..")) continue;
      const parts = rel.split(sep);
      tops.add(parts[0]!.startsWith("@") ? join(parts[0]!, parts[1] ?? "") : parts[0]!);
    }

    // ---- the base: host files, and the packages under /app/node_modules
    // bwrap: deploy/Dockerfile takes the cell sandbox from the base when it has one (no apt-get here).
    const bins = [which("node"), which("etcd"), which("sh"), which("sleep"), which("date"), which("bwrap")];
    const files = new Set<string>();
    for (const b of bins) {
      files.add(b);
      for (const l of libs(b)) files.add(l);
    }
    const baseHash = createHash("sha256");
    for (const f of [...files].sort()) baseHash.update(`${f}:${readFileSync(realpathSync(f)).length}\n`);
    for (const t of [...tops].sort()) baseHash.update(`${t}:${readFileSync(join(nm, t, "package.json"), "utf8")}\n`);
    const base = `cairn-drill-base:${baseHash.digest("hex").slice(0, 12)}`;
    if (!imageExists(base)) {
      const t = Date.now();
      const rootfs = join(work, "rootfs");
      for (const f of files) place(rootfs, f);
      for (const [name, target] of [["sh", which("sh")], ["sleep", which("sleep")], ["date", which("date")], ["node", which("node")], ["etcd", which("etcd")]] as const) {
        for (const dir of ["bin", "usr/bin"]) {
          const dest = join(rootfs, dir, name);
          mkdirSync(dirname(dest), { recursive: true });
          if (!existsSync(dest)) copyFileSync(target, dest);
          chmodSync(dest, 0o755);
        }
      }
      mkdirSync(join(rootfs, "tmp"), { recursive: true });
      chmodSync(join(rootfs, "tmp"), 0o1777);
      mkdirSync(join(rootfs, "etc"), { recursive: true });
      writeFileSync(join(rootfs, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n");
      writeFileSync(join(rootfs, "etc/group"), "root:x:0:\nnogroup:x:65534:\n");
      mkdirSync(join(rootfs, "root"), { recursive: true });
      for (const top of tops) cpSync(join(nm, top), join(rootfs, "app", "node_modules", top), { recursive: true, dereference: true });
      const tar = execFileSync("tar", ["-C", rootfs, "-c", "."], { maxBuffer: 1 << 30 });
      sh("docker", ["import", "-", base], tar);
      log(`drill: imported ${base} from the host's files and ${tops.size} packages (${(tar.length / 1e6).toFixed(0)} MB) in ${Date.now() - t} ms`);
    }

    // ---- the worker: deploy/Dockerfile FROM the base, the context holding the bundled CLI
    const ctx = join(work, "context");
    mkdirSync(ctx);
    const esbuild = await import("esbuild");
    const common = { bundle: true, platform: "node", format: "esm", target: "node20", packages: "external", logLevel: "error" } as const;
    await esbuild.build({ ...common, entryPoints: [join(REPO, "src/cli/entry.ts")], outfile: join(ctx, "cairn.mjs") });
    await esbuild.build({ ...common, entryPoints: [join(REPO, "src/exec/keeper-main.ts")], outfile: join(ctx, KEEPER_BUNDLE) });
    // The cell launcher, when built here: the workers then start cells as a deployment would.
    const launcher = join(REPO, "build", "cairn-launcher");
    if (existsSync(launcher)) {
      mkdirSync(join(ctx, "build"));
      copyFileSync(launcher, join(ctx, "build", "cairn-launcher"));
      chmodSync(join(ctx, "build", "cairn-launcher"), 0o755);
    }
    const h = createHash("sha256").update(base).update(readFileSync(join(ctx, "cairn.mjs"))).update(readFileSync(join(ctx, KEEPER_BUNDLE))).update(readFileSync(join(REPO, "deploy/Dockerfile")));
    if (existsSync(launcher)) h.update(readFileSync(launcher));
    const worker = `cairn-drill-worker:${h.digest("hex").slice(0, 12)}`;
    if (!imageExists(worker)) {
      const t = Date.now();
      copyFileSync(join(REPO, "deploy/Dockerfile"), join(ctx, "Dockerfile"));
      writeFileSync(join(ctx, ".dockerignore"), "Dockerfile\n.dockerignore\n");
      await GenericContainer.fromDockerfile(ctx, "Dockerfile").withBuildArgs({ BASE: base }).build(worker, { deleteOnExit: false });
      log(`drill: built ${worker} from deploy/Dockerfile in ${Date.now() - t} ms`);
    }
    return { base, worker };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
