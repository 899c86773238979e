/**
 * Multi-row INSERT statements, prepared on first use and cached by row count: one native call per
 * INSERT_ROWS rows instead of one per row. Used by the two adapters that keep SQLite files (the
 * sqlite adapter's log, the replicated adapter's local copy), both through better-sqlite3.
 */
import type BetterSqlite3 from "better-sqlite3";

type Value = string | number | bigint | Buffer | null;

/** Rows per INSERT statement (a few parameters each, far below SQLite's limit of 32,766 per statement). */
export const INSERT_ROWS = 32;

export class RowInserter {
  private readonly byCount = new Map<number, BetterSqlite3.Statement<Value[]>>();

  /** `into` is the statement's head, e.g. `INSERT INTO events (seq, identity, json)`, with `columns` columns. */
  constructor(
    private readonly db: BetterSqlite3.Database,
    private readonly into: string,
    private readonly columns: number,
  ) {}

  /** The statement inserting `count` rows (1 to INSERT_ROWS); its parameters are the rows' values in order. */
  statement(count: number): BetterSqlite3.Statement<Value[]> {
    let statement = this.byCount.get(count);
    if (statement === undefined) {
      if (!Number.isSafeInteger(count) || count < 1 || count > INSERT_ROWS) throw new RangeError(`a multi-row insert holds 1 to ${INSERT_ROWS} rows, not ${count}`);
      const row = `(${Array.from({ length: this.columns }, () => "?").join(", ")})`;
      statement = this.db.prepare<Value[]>(`${this.into} VALUES ${Array.from({ length: count }, () => row).join(", ")}`);
      this.byCount.set(count, statement);
    }
    return statement;
  }

  /**
   * Inserts every row of `values` (the rows' values in order, `columns` per row), INSERT_ROWS rows
   * per statement, and checks that each statement inserted all its rows. Run it inside a transaction.
   */
  insertAll(values: readonly Value[]): void {
    if (values.length % this.columns !== 0) throw new RangeError(`${values.length} values do not make whole rows of ${this.columns}`);
    const rows = values.length / this.columns;
    for (let from = 0; from < rows; from += INSERT_ROWS) {
      const count = Math.min(INSERT_ROWS, rows - from);
      const result = this.statement(count).run(...values.slice(from * this.columns, (from + count) * this.columns));
      if (result.changes !== count) throw new Error(`${this.into}: inserted ${result.changes} of ${count} rows`);
    }
  }
}
