/* global document, location, EventSource, URLSearchParams */
// The Cairn timeline page: one small script, no build step, no dependencies.
// It reads /api/stream (server-sent events): a `snapshot` of the database's timeline, then an `update`
// per commit with the rounds and cells that changed and the new owners and marks. Bars sit on a time
// axis through CSS variables (--s start and --d length in seconds, --span per session), so a growing
// run only changes one variable per session.
"use strict";
(() => {
  const $ = (sel, el = document) => el.querySelector(sel);
  const params = new URLSearchParams(location.search);
  const sessions = new Map(); // id -> {data, el, rows: Map(key -> row), running: Set(key)}
  let db = null;
  let source = null;

  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const t = (iso) => Date.parse(iso);
  const secs = (ms) => Math.max(0, ms) / 1000;
  const fmtDur = (ms) => (ms == null ? "?" : ms < 1000 ? `${Math.round(ms)} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`);
  const fmtOffset = (s) => (s < 60 ? `+${+s.toFixed(s < 10 && s % 1 ? 1 : 0)}s` : s < 3600 ? `+${Math.floor(s / 60)}m${s % 60 ? `${Math.round(s % 60)}s` : ""}` : `+${Math.floor(s / 3600)}h${Math.round((s % 3600) / 60)}m`);

  function cellOutcome(c) {
    if (c.result === "UnknownExecution") return "unknown";
    if (c.result) return c.result;
    if (c.started_at) return "running";
    return c.approval && c.approval.state === "waiting" ? "awaiting" : "queued";
  }
  function roundOutcome(r) {
    if (r.rejected.length > 0 || r.failed.length > 0) return "refused";
    return r.outcome; // accepted | open
  }

  function sessionEnd(s) {
    const d = s.data;
    let end = t(d.header.last_at);
    if (d.header.status === "running" || d.header.status === "paused") end = Math.max(end, Date.now());
    return end;
  }

  function setSpan(s) {
    const t0 = t(s.data.header.created_at);
    const span = Math.max(secs(sessionEnd(s) - t0), 0.001);
    s.el.style.setProperty("--span", String(span));
    for (const key of s.running) place(s, key);
    renderAxis(s, span);
  }

  function renderAxis(s, span) {
    const axis = $(".axis", s.el);
    const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400];
    const step = steps.find((x) => span / x <= 8) ?? 86400;
    if (axis.dataset.step === String(step) && axis.childElementCount === Math.floor(span / step) + 1) return;
    axis.dataset.step = String(step);
    axis.replaceChildren();
    for (let x = 0; x <= span + 1e-9; x += step) {
      const tick = el("span", "tick", fmtOffset(x));
      tick.style.setProperty("--s", String(x));
      axis.append(tick);
    }
  }

  // Where a row's bar starts and how long it is, in seconds from the session's start.
  function extent(s, key) {
    const d = s.data;
    const t0 = t(d.header.created_at);
    const now = sessionEnd(s);
    if (key[0] === "r") {
      const r = d.rounds.get(Number(key.slice(1)));
      const start = t(r.start);
      return [secs(start - t0), secs((r.end ? t(r.end) : now) - start), r.end === null];
    }
    const c = d.cells.get(Number(key.slice(1)));
    const start = t(c.started_at ?? c.queued_at);
    const end = c.finished_at ? t(c.finished_at) : c.started_at ? now : start;
    return [secs(start - t0), secs(end - start), !c.finished_at];
  }

  function place(s, key) {
    const row = s.rows.get(key);
    const [start, len, open] = extent(s, key);
    const bar = $(".bar", row);
    bar.style.setProperty("--s", start.toFixed(3));
    bar.style.setProperty("--d", len.toFixed(3));
    for (const q of row.querySelectorAll(".unknown-mark, .effects")) {
      q.style.setProperty("--s", start.toFixed(3));
      q.style.setProperty("--d", len.toFixed(3));
    }
    if (open) s.running.add(key);
    else s.running.delete(key);
  }

  function rowSortTime(s, key) {
    return key[0] === "r" ? t(s.data.rounds.get(Number(key.slice(1))).start) : t(s.data.cells.get(Number(key.slice(1))).queued_at);
  }

  function ensureRow(s, key) {
    let row = s.rows.get(key);
    if (row) return row;
    row = el("div", "row");
    row.dataset.key = key;
    row.dataset.kind = key[0] === "r" ? "round" : "cell";
    row.dataset.id = key.slice(1);
    row.dataset.t = String(rowSortTime(s, key));
    row.append(el("span", "label"));
    const track = el("div", "track");
    track.append(el("div", "bar"));
    row.append(track);
    row.addEventListener("click", () => showDetail(s, key, row));
    // Chronological order (rounds before the cells they added at the same instant); events arrive in
    // order, so this is almost always an append.
    const rows = $(".rows", s.el);
    const marks = $(".row.marks", rows);
    let before = marks;
    const tRow = Number(row.dataset.t);
    for (let prev = marks ? marks.previousElementSibling : rows.lastElementChild; prev && prev.classList.contains("row"); prev = prev.previousElementSibling) {
      if (Number(prev.dataset.t) <= tRow) break;
      before = prev;
    }
    rows.insertBefore(row, before);
    s.rows.set(key, row);
    return row;
  }

  function renderRound(s, r) {
    const key = `r${r.n}`;
    const row = ensureRow(s, key);
    const outcome = roundOutcome(r);
    $(".label", row).textContent = `round ${r.n}${r.attempts > 1 ? ` (${r.attempts} attempts)` : ""}`;
    const bar = $(".bar", row);
    bar.className = `bar ${outcome}`;
    bar.dataset.outcome = outcome;
    const refusals = r.rejected.map((x) => `refused: ${x.reason}`).concat(r.failed.map((x) => `attempt ${x.attempt} failed: ${x.error}`));
    row.title = [`round ${r.n}: ${r.outcome}`, `model ${fmtDur(r.latency_ms)}, tokens ${r.tokens_in} in / ${r.tokens_out} out`, ...refusals].join("\n");
    place(s, key);
  }

  function renderCell(s, c) {
    const key = `c${c.id}`;
    const row = ensureRow(s, key);
    const outcome = cellOutcome(c);
    $(".label", row).textContent = `cell ${c.id} ${c.kind}: ${c.summary}`;
    const bar = $(".bar", row);
    bar.className = `bar ${outcome}`;
    bar.dataset.outcome = outcome;
    let q = $(".unknown-mark", row);
    if (outcome === "unknown" && !q) {
      q = el("span", "unknown-mark", c.resolved_by ? "?✓" : "?");
      $(".track", row).append(q);
    } else if (q) q.textContent = c.resolved_by ? "?✓" : "?";
    row.classList.toggle("has-unknown", outcome === "unknown");
    row.classList.toggle("unsandboxed", c.sandbox === "none");
    row.dataset.sandbox = c.sandbox ?? "";
    const contained = c.sandbox === "bwrap" ? `, sandboxed (network ${c.network ?? "off"})` : c.sandbox === "none" ? ", NOT sandboxed" : "";
    const where = c.host ? ` on ${c.host}${c.epoch != null ? ` (epoch ${c.epoch})` : ""}${contained}` : "";
    const gate = c.approval ? `; approval (rule ${c.approval.rule}): ${c.approval.state}${c.approval.reason ? `: ${c.approval.reason}` : ""}` : "";
    const how = c.result === "UnknownExecution" ? `UnknownExecution: ${c.unknown?.reason ?? ""}${c.resolved_by ? `; resolved by note ${c.resolved_by.note_id}` : "; unresolved"}` : c.result ? `${c.result}${c.exit_code != null ? ` exit ${c.exit_code}` : ""} in ${fmtDur(c.duration_ms)}` : outcome;
    // The effects it declared (`cairn effect`), under the cell: done ones with their result.
    const effects = c.effects ?? [];
    let fx = $(".effects", row);
    if (effects.length > 0 && !fx) {
      fx = el("span", "effects");
      $(".track", row).append(fx);
    }
    if (fx) {
      const uncertain = effects.filter((f) => f.status === "uncertain").length;
      fx.textContent = `${effects.length} effect(s)${uncertain ? `, ${uncertain} uncertain` : ""}`;
      fx.classList.toggle("uncertain", uncertain > 0);
    }
    row.dataset.effects = effects.map((f) => `${f.name}:${f.status}`).join(" ");
    const fxLines = effects.map((f) => `effect ${f.name}: ${f.status}${f.status === "done" ? ` ${JSON.stringify(f.result ?? null)}` : f.status === "uncertain" ? " (begun, never ended)" : ""}`);
    row.title = [`cell ${c.id}${where}: ${how}${gate}`, ...fxLines].join("\n");
    place(s, key);
  }

  function renderOwners(s) {
    const rows = $(".rows", s.el);
    for (const line of rows.querySelectorAll(".owner-line")) line.remove();
    const t0 = t(s.data.header.created_at);
    s.data.owners.forEach((o, i) => {
      // The first owner is the run's start; draw it too, so every epoch shows where it began.
      const line = el("div", "owner-line");
      line.dataset.epoch = String(o.epoch);
      line.dataset.host = o.host;
      line.style.setProperty("--s", secs(t(o.at) - t0).toFixed(3));
      line.append(el("span", "", `${i === 0 ? "" : "→ "}epoch ${o.epoch} · ${o.host}`));
      line.title = `owner: epoch ${o.epoch} on ${o.host} (pid ${o.pid}) since ${o.at}`;
      rows.append(line);
    });
  }

  function renderMarks(s) {
    const rows = $(".rows", s.el);
    let row = $(".row.marks", rows);
    if (!row) {
      row = el("div", "row marks");
      row.append(el("span", "label", "timers, posts, controls"));
      row.append(el("div", "track"));
      rows.append(row);
    }
    const track = $(".track", row);
    track.replaceChildren();
    const t0 = t(s.data.header.created_at);
    for (const m of s.data.marks) {
      const tick = el("span", `mark ${m.outcome} ${m.kind}`);
      tick.style.setProperty("--s", secs(t(m.at) - t0).toFixed(3));
      tick.title = m.text;
      track.append(tick);
    }
    row.onclick = () => openDetail("events", s.data.marks.map((m) => `${m.at}  ${m.text}`).join("\n"));
  }

  function renderHeader(s) {
    const h = s.data.header;
    s.el.dataset.status = h.status;
    const head = $("h2", s.el);
    head.replaceChildren(el("span", "sid", h.id), el("span", `status ${h.status}`, h.status), el("span", "goal", h.goal));
    const d = s.data;
    const unknown = [...d.cells.values()].filter((c) => c.result === "UnknownExecution").length;
    const paused = h.paused ? ` · PAUSED since ${h.paused.at}${h.paused.reason ? `: ${h.paused.reason}` : ""}` : "";
    const waits = h.awaiting_approval && h.awaiting_approval.length > 0 ? ` · waits for approval: cell ${h.awaiting_approval.join(", cell ")}` : "";
    $(".meta", s.el).textContent = `started ${h.created_at} in ${h.cwd} · ${d.rounds.size} round(s) · ${d.cells.size} cell(s)${unknown ? ` · ${unknown} UnknownExecution` : ""}${paused}${waits}${h.reason ? ` · ${h.reason}` : ""}`;
  }

  function ensureSession(id, header) {
    let s = sessions.get(id);
    if (s) return s;
    const section = el("section", "session");
    section.id = `session-${id}`;
    section.dataset.session = id;
    section.append(el("h2"), el("div", "meta"));
    const chart = el("div", "chart");
    chart.append(el("div", "axis"), el("div", "rows"));
    section.append(chart);
    s = { el: section, rows: new Map(), running: new Set(), data: { header, rounds: new Map(), cells: new Map(), owners: [], marks: [] } };
    sessions.set(id, s);
    const main = $("#sessions");
    $(".empty", main)?.remove();
    main.append(section);
    return s;
  }

  // Applies one session's data (a snapshot's SessionView, or an update's changes).
  function applySession(id, header, rounds, cells, owners, marks) {
    const s = ensureSession(id, header);
    s.data.header = header;
    for (const r of rounds) s.data.rounds.set(r.n, r);
    for (const c of cells) s.data.cells.set(c.id, c);
    s.data.owners.push(...owners);
    s.data.marks.push(...marks);
    renderHeader(s);
    for (const r of rounds) renderRound(s, r);
    for (const c of cells) renderCell(s, c);
    if (owners.length > 0) renderOwners(s);
    if (marks.length > 0 || !$(".row.marks", s.el)) renderMarks(s);
    setSpan(s);
  }

  function onSnapshot(snap) {
    sessions.clear();
    const main = $("#sessions");
    main.replaceChildren();
    document.body.dataset.head = String(snap.head);
    if (snap.sessions.length === 0) main.append(el("p", "empty", `database ${snap.db} has no runs yet; they appear here as they start.`));
    for (const v of snap.sessions) {
      const { rounds, cells, owners, marks, ...header } = v;
      applySession(v.id, header, rounds, cells, owners, marks);
    }
  }

  function onUpdate(u) {
    document.body.dataset.head = String(u.head);
    for (const c of u.sessions) applySession(c.id, c.header, c.rounds, c.cells, c.owners, c.marks);
  }

  function openDetail(title, text) {
    $("#detail-title").textContent = title;
    $("#detail-body").textContent = text;
    $("#detail").hidden = false;
    document.body.classList.add("detail-open");
  }

  async function showDetail(s, key, row) {
    for (const r of document.querySelectorAll(".row.selected")) r.classList.remove("selected");
    row.classList.add("selected");
    const id = s.data.header.id;
    const q = `db=${encodeURIComponent(db)}&session=${encodeURIComponent(id)}`;
    if (key[0] === "r") {
      const r = s.data.rounds.get(Number(key.slice(1)));
      const lines = [`${r.outcome}, revision ${r.revision ?? "-"}; ${r.attempts} attempt(s), model ${fmtDur(r.latency_ms)}, tokens ${r.tokens_in} in / ${r.tokens_out} out`];
      for (const x of r.failed) lines.push(`attempt ${x.attempt} failed: ${x.error}`);
      for (const x of r.rejected) lines.push(`patch refused (attempt ${x.attempt}, ${x.code}): ${x.reason}`);
      for (const c of r.new_cells) lines.push(`+ cell ${c.id} ${c.kind}${c.role ? ` (${c.role})` : ""}: ${c.summary}`);
      const res = await fetch(`/api/patch?${q}&round=${r.n}`);
      lines.push("", res.ok ? await res.text() : "(no patch recorded yet)");
      openDetail(`${id} round ${r.n}: patch`, lines.join("\n"));
    } else {
      const c = s.data.cells.get(Number(key.slice(1)));
      const res = await fetch(`/api/output?${q}&cell=${c.id}`);
      const head = [row.title];
      if (c.detail) head.push(c.detail);
      openDetail(`${id} cell ${c.id}: output`, `${head.join("\n")}\n\n${res.ok ? await res.text() : "(no output)"}`);
    }
  }

  function connect() {
    const live = $("#live");
    source?.close();
    source = new EventSource(`/api/stream?db=${encodeURIComponent(db)}`);
    source.addEventListener("snapshot", (ev) => onSnapshot(JSON.parse(ev.data)));
    source.addEventListener("update", (ev) => onUpdate(JSON.parse(ev.data)));
    source.addEventListener("status", (ev) => {
      const st = JSON.parse(ev.data);
      live.className = st.ok ? "live on" : "live off";
      live.textContent = st.ok ? "live" : `storage: ${st.error}`;
    });
    source.onopen = () => {
      live.className = "live on";
      live.textContent = "live";
    };
    source.onerror = () => {
      live.className = "live off";
      live.textContent = "reconnecting";
    };
  }

  async function start() {
    $("#detail-close").addEventListener("click", () => {
      $("#detail").hidden = true;
      document.body.classList.remove("detail-open");
    });
    const res = await fetch("/api/databases");
    if (!res.ok) {
      $("#sessions").replaceChildren(el("p", "empty", await res.text()));
      return;
    }
    const { databases } = await res.json();
    db = params.get("db") && databases.includes(params.get("db")) ? params.get("db") : databases[0];
    const nav = $("#databases");
    for (const name of databases) {
      const a = el("a", name === db ? "current" : "", name);
      a.href = `?db=${encodeURIComponent(name)}`;
      nav.append(a);
    }
    if (!db) {
      $("#sessions").replaceChildren(el("p", "empty", "no databases here"));
      return;
    }
    document.title = `${db}: Cairn timeline`;
    connect();
    // Running sessions grow with the clock between commits.
    setInterval(() => {
      for (const s of sessions.values()) if (s.data.header.status === "running" || s.data.header.status === "paused") setSpan(s);
    }, 1000);
  }

  start().catch((err) => {
    $("#sessions").replaceChildren(el("p", "empty", `failed to load: ${err}`));
  });
})();
