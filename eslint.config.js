// @ts-check
import js from "@eslint/js";
import tseslint from "typescript-eslint";

/**
 * The layers, as import rules (ARCHITECTURE.md; README "Architecture notes"):
 * - src/state is the pure core: it imports nothing with effects (no Node I/O, no storage, harness,
 *   executor, model, observability or CLI, no adapter).
 * - the harness depends on the Storage contract, never on an adapter.
 * - an adapter never imports another adapter.
 */
const EFFECTFUL_NODE = ["fs", "fs/promises", "child_process", "net", "http", "https", "http2", "dgram", "dns", "os", "worker_threads", "cluster", "process", "perf_hooks", "timers", "timers/promises", "readline", "tls", "vm"].flatMap((m) => [m, `node:${m}`]);
const ADAPTERS = ["memory", "sqlite", "replicated", "durable-streams"];

const pureCore = {
  paths: EFFECTFUL_NODE.map((name) => ({ name, message: "src/state is the pure core: no I/O. Do the effect in the harness and pass the result in." })),
  patterns: [
    {
      group: ["**/storage/**", "**/harness/**", "**/exec/**", "**/model/**", "**/observability/**", "**/cli/**", "**/storage-adapters/**"],
      message: "src/state is the pure core: it imports only src/state modules and pure libraries (zod, smol-toml, fast-json-patch).",
    },
    { group: ["pino", "pino-*", "execa", "better-sqlite3", "etcd3", "prom-client", "openai", "@anthropic-ai/*"], message: "src/state is the pure core: no library with effects." },
  ],
};

export default tseslint.config(
  { ignores: ["dist/**", "node_modules/**", "examples/**", "**/.cairn/**"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { process: "readonly", console: "readonly", Buffer: "readonly", setTimeout: "readonly", clearTimeout: "readonly", setInterval: "readonly", clearInterval: "readonly", URL: "readonly", TextEncoder: "readonly", TextDecoder: "readonly", AbortController: "readonly", AbortSignal: "readonly", fetch: "readonly", setImmediate: "readonly" } },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_", caughtErrorsIgnorePattern: "^_" }],
      "@typescript-eslint/no-non-null-assertion": "off",
      "no-console": "error",
    },
  },
  {
    // Promises must be awaited, returned, or explicitly discarded with `void` (type-checked).
    files: ["**/*.ts"],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // node:test's test() and describe() return promises the runner itself awaits.
      "@typescript-eslint/no-floating-promises": ["error", { allowForKnownSafeCalls: [{ from: "package", package: "node:test", name: ["test", "it", "describe", "suite", "before", "after", "beforeEach", "afterEach"] }] }],
      "@typescript-eslint/no-misused-promises": "error",
    },
  },
  {
    files: ["src/state/**/*.ts"],
    rules: { "no-restricted-imports": ["error", pureCore] },
  },
  {
    files: ["src/harness/**/*.ts"],
    rules: {
      "no-restricted-imports": ["error", { patterns: [{ group: ["**/storage-adapters/**"], message: "the harness depends on the Storage contract (src/storage/contract.ts), never on an adapter." }] }],
    },
  },
  ...ADAPTERS.map((adapter) => ({
    files: [`storage-adapters/${adapter}/**/*.ts`],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          patterns: [
            {
              group: ADAPTERS.filter((a) => a !== adapter).flatMap((a) => [`../${a}/**`, `**/storage-adapters/${a}/**`]),
              message: "an adapter never imports another adapter: shared storage rules live in src/storage.",
            },
          ],
        },
      ],
    },
  })),
  {
    // The CLI, tests, benchmarks and chaos drivers talk to a terminal.
    files: ["src/cli/**", "test/**", "bench/**", "chaos/**", "bin/**", "scripts/**", "**/*.test.ts"],
    rules: { "no-console": "off" },
  },
);
