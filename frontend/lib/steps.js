// Per-rank step timings of one job, as a ranks x steps matrix for the heatmap and the
// cohort's median / worst rank per step for the line chart. Fed with the columnar
// answers of GET /jobs/<job>/steps (rank, step, start, end, attempt, iteration); a step
// redone after a restart (a new attempt or in-process iteration) is a column of its own,
// so the matrix runs over time and shows the progress a rollback lost.

const keyOf = (attempt, iteration, step) => `${attempt}/${iteration}/${step}`;

function median(sorted) {
  const n = sorted.length;
  if (n === 0) return null;
  return n % 2 ? sorted[(n - 1) / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

export class StepMatrix {
  #columns = new Map(); // key -> {attempt, iteration, step, firstEnd, lastEnd, times: Map<rank, s>}
  #ranks = new Set();
  #maxColumns;
  lastEnd = null; // newest `end` seen: the next read asks for steps since then

  constructor({ maxColumns = 300 } = {}) {
    this.#maxColumns = maxColumns;
  }

  /** Merge one answer's columns; returns the number of new (rank, step) cells. */
  add(columns) {
    const n = columns?.rank?.length ?? 0;
    let added = 0;
    for (let i = 0; i < n; i++) {
      const rank = columns.rank[i];
      const end = columns.end[i];
      const attempt = columns.attempt?.[i] ?? 0;
      const iteration = columns.iteration?.[i] ?? 0;
      const step = columns.step[i];
      const key = keyOf(attempt, iteration, step);
      let col = this.#columns.get(key);
      if (!col) {
        col = { attempt, iteration, step, firstEnd: end, lastEnd: end, times: new Map() };
        this.#columns.set(key, col);
      }
      if (!col.times.has(rank)) added++;
      col.times.set(rank, end - columns.start[i]);
      col.firstEnd = Math.min(col.firstEnd, end);
      col.lastEnd = Math.max(col.lastEnd, end);
      this.#ranks.add(rank);
      if (this.lastEnd === null || end > this.lastEnd) this.lastEnd = end;
    }
    this.#trim();
    return added;
  }

  #trim() {
    if (this.#columns.size <= this.#maxColumns) return;
    const ordered = [...this.#columns.entries()].sort((a, b) => a[1].firstEnd - b[1].firstEnd);
    for (const [key] of ordered.slice(0, ordered.length - this.#maxColumns)) this.#columns.delete(key);
  }

  get cellCount() {
    let n = 0;
    for (const col of this.#columns.values()) n += col.times.size;
    return n;
  }

  /**
   * The matrix in time order: {ranks, columns: [{attempt, iteration, step, t}],
   * values: Float64Array (row = rank index, NaN = no report), median[], worst[], worstRank[]}.
   */
  build() {
    const ranks = [...this.#ranks].sort((a, b) => a - b);
    const rowOf = new Map(ranks.map((r, i) => [r, i]));
    const cols = [...this.#columns.values()].sort(
      (a, b) => a.firstEnd - b.firstEnd || a.step - b.step,
    );
    const nc = cols.length;
    const values = new Float64Array(ranks.length * nc).fill(Number.NaN);
    const med = new Array(nc);
    const worst = new Array(nc);
    const worstRank = new Array(nc);
    cols.forEach((col, c) => {
      const times = [];
      let maxT = -Infinity;
      let maxR = null;
      for (const [rank, t] of col.times) {
        values[rowOf.get(rank) * nc + c] = t;
        times.push(t);
        if (t > maxT) {
          maxT = t;
          maxR = rank;
        }
      }
      times.sort((a, b) => a - b);
      med[c] = median(times);
      worst[c] = maxR === null ? null : maxT;
      worstRank[c] = maxR;
    });
    return {
      ranks,
      columns: cols.map((col) => ({
        attempt: col.attempt,
        iteration: col.iteration,
        step: col.step,
        t: col.firstEnd,
      })),
      values,
      median: med,
      worst,
      worstRank,
    };
  }
}
