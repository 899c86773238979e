/**
 * `withHarness`: opens a Harness, runs a test's body with it, and closes it whether the body returns
 * or throws, so a failing assertion never leaves a harness (its drivers, cells and storage) open
 * behind the test. When the body throws, a failure of the close is dropped: the body's error is the
 * one worth reading.
 */
import { Harness, type HarnessOpenOptions } from "../../src/harness/harness.js";

export async function withHarness<T>(options: HarnessOpenOptions, body: (h: Harness) => Promise<T>): Promise<T> {
  const h = await Harness.open(options);
  let result: T;
  try {
    result = await body(h);
  } catch (err) {
    await h.close().catch(() => undefined);
    throw err;
  }
  await h.close();
  return result;
}
