/**
 * A local three-member etcd cluster for development: tests, benchmarks, the chaos drivers
 * (`startDevCluster`) and `cairn cluster` (`clusterUp` and the rest). It ships with the CLI because
 * `cairn cluster` uses it; it is not for production (see deploy/etcd).
 */
export * from "./members.js";
export * from "./devcluster.js";
export * from "./detached.js";
