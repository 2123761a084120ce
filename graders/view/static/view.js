// gradekit view / report: one small script, no dependencies.
// Server mode asks the JSON API (filtering and paging run on the server, over the whole file);
// report mode answers the same questions from the rows inlined in the HTML file.
"use strict";
(function () {
  const MODE = document.body.dataset.mode === "report" ? "report" : "server";
  const DATA = JSON.parse(document.getElementById("gradekit-data").textContent || "null");
  const PAGE = 50;
  const RESULT = new Set(["index", "score", "label", "status", "error_kind", "error", "rationale", "reasoning", "prompt_tokens",
    "completion_tokens", "cached", "winner", "decided_by", "agree", "winner_ab", "winner_ba", "label_ab", "label_ba",
    "score_ab", "score_ba", "rationale_ab", "rationale_ba", "human_label", "raw_reply", "raw_reply_ab", "raw_reply_ba",
    "human_note", "labelled", "hidden", "checklist", "criteria_read", "criteria_total", "served_model", "system_fingerprint", "drift"]);
  // A checklist row's criteria.<id>.label / .score columns: shown in its checklist, not as inputs.
  const isCriterionColumn = (k) => /^criteria\.[^.]+\.(label|score)$/.test(k);
  const RAW = ["raw_reply", "raw_reply_ab", "raw_reply_ba"];
  const $ = (id) => document.getElementById(id);
  let summary = null, offset = 0, total = 0, columns = null, judgeColumn = "label";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick") node.addEventListener("click", v); else if (v !== undefined && v !== null) node.setAttribute(k, v);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    return node;
  }
  const show = (v) => v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
  const pct = (v) => v === null || v === undefined ? "n/a" : (100 * v).toFixed(1) + "%";
  const num = (v, d = 3) => v === null || v === undefined ? "n/a" : Number(v).toFixed(d);

  // ---- data: the API, or the report's inlined rows ------------------------------------------
  async function api(path) {
    const response = await fetch(path);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }
  function params() {
    const form = $("filters"), out = {};
    for (const name of ["status", "label", "error_kind", "served_model", "system_fingerprint", "score_min", "score_max", "q"]) {
      const value = form.elements[name].value.trim();
      if (value) out[name] = value;
    }
    for (const name of ["disagree", "flipped", "drift"]) if (form.elements[name].checked) out[name] = "true";
    if ($("sort").value) out.sort = $("sort").value;
    return out;
  }
  function disagrees(row) {
    return row.status === "ok" && row.human_label !== null && row.human_label !== undefined &&
      show(row[judgeColumn]) !== show(row.human_label);
  }
  function localRows(p, from, limit) {
    const q = (p.q || "").toLowerCase(), statuses = p.status ? p.status.split(",") : null;
    let rows = DATA.rows.filter((r) =>
      (!statuses || statuses.includes(show(r.status))) && (!p.label || show(r[judgeColumn]) === p.label) &&
      (!p.error_kind || show(r.error_kind) === p.error_kind) &&
      (!p.served_model || show(r.served_model) === p.served_model) &&
      (!p.system_fingerprint || show(r.system_fingerprint) === p.system_fingerprint) &&
      (!p.drift || r.drift === true || r.drift === "true") &&
      (p.score_min === undefined || (r.score !== null && r.score >= Number(p.score_min))) &&
      (p.score_max === undefined || (r.score !== null && r.score <= Number(p.score_max))) &&
      (!p.disagree || disagrees(r)) && (!p.flipped || r.agree === false || r.agree === "false") &&
      (!q || Object.entries(r).some(([k, v]) => typeof v === "string" && v.toLowerCase().includes(q))));
    if (p.sort) {
      const desc = p.sort.startsWith("-"), key = desc ? p.sort.slice(1) : p.sort;
      rows = rows.slice().sort((a, b) => {
        const x = a[key], y = b[key];
        if (x === y) return a.index - b.index;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * (desc ? -1 : 1);
      });
    } // else: the report's own order, the worst rows first
    return { total: rows.length, rows: rows.slice(from, from + limit) };
  }
  const source = MODE === "server" ? {
    summary: () => api("/api/summary"),
    rows: (p, from, limit) => api("/api/rows?" + new URLSearchParams({ ...p, offset: from, limit })),
    row: (i) => api("/api/rows/" + i),
    prompt: (i) => fetch("/api/rows/" + i + "/prompt").then((r) => r.ok ? r.json() : null),
  } : {
    summary: async () => DATA.summary,
    rows: async (p, from, limit) => localRows(p, from, limit),
    row: async (i) => DATA.rows.find((r) => r.index === i),
    prompt: async () => null,
  };

  // ---- the summary ----------------------------------------------------------------------------
  function counts(title, table, filter) {
    const body = el("tbody");
    for (const [key, n] of Object.entries(table || {})) {
      const name = filter ? el("a", { "data-filter": filter, "data-value": key, onclick: () => setFilter(filter, key) }, key) : key;
      body.append(el("tr", {}, el("td", {}, name), el("td", { class: "n" }, n.toLocaleString())));
    }
    return el("div", { class: "card" }, el("h3", {}, title), el("table", { class: "counts" }, body));
  }
  function histogram(title, score) {
    const card = el("div", { class: "card" }, el("h3", {}, title));
    if (!score || !score.count) { card.append(el("p", { class: "muted" }, "no scores")); return card; }
    const ns = "http://www.w3.org/2000/svg", w = 240, h = 80, bins = score.histogram, most = Math.max(...bins.map((b) => b.count));
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "hist"); svg.setAttribute("width", w); svg.setAttribute("height", h + 14);
    bins.forEach((b, i) => {
      const rect = document.createElementNS(ns, "rect"), bh = most ? Math.max(b.count ? 1 : 0, (h * b.count) / most) : 0;
      rect.setAttribute("x", (i * w) / bins.length + 1); rect.setAttribute("width", w / bins.length - 2);
      rect.setAttribute("y", h - bh); rect.setAttribute("height", bh);
      const tip = document.createElementNS(ns, "title"); tip.textContent = `[${num(b.low, 2)}, ${num(b.high, 2)}): ${b.count}`;
      rect.append(tip); svg.append(rect);
    });
    for (const [x, text, anchor] of [[0, num(bins[0].low, 1), "start"], [w, num(bins[bins.length - 1].high, 1), "end"]]) {
      const t = document.createElementNS(ns, "text");
      t.setAttribute("x", x); t.setAttribute("y", h + 12); t.setAttribute("text-anchor", anchor); t.textContent = text; svg.append(t);
    }
    card.append(svg, el("div", { class: "muted" }, `mean ${num(score.mean)} over ${score.count.toLocaleString()} scores`));
    return card;
  }
  // A checklist file: per criterion, how often it was read and its mean score (an unread criterion is an error, never a 0).
  function checklistSummary(items) {
    const head = el("tr", {}, ...["criterion", "read", "errors", "mean score", "labels"].map((h) => el("th", {}, h)));
    const rows = items.map((c) => el("tr", {}, el("td", {}, c.id), el("td", {}, `${c.read}/${c.rows}`), el("td", {}, String(c.errors)),
      el("td", {}, num(c.mean_score)), el("td", {}, Object.entries(c.labels || {}).map(([k, v]) => `${k} ${v}`).join(", "))));
    return el("div", { class: "card", id: "checklist-summary" }, el("h3", {}, "checklist, per criterion"),
      el("table", { class: "counts" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }
  // One row's checklist: each criterion's verdict and score, or why it has none.
  function checklistTable(row) {
    let items = row.checklist;
    if (typeof items === "string") { try { items = JSON.parse(items); } catch (e) { items = null; } }
    if (!Array.isArray(items)) return null;
    const head = el("tr", {}, ...["criterion", "verdict", "score", "weight", "why"].map((h) => el("th", {}, h)));
    const rows = items.map((c) => el("tr", { class: c.status === "ok" ? null : "status-error" },
      el("td", {}, c.id + (c.required ? " (required)" : "")), el("td", {}, c.status === "ok" ? show(c.label) : "error"),
      el("td", {}, c.status === "ok" ? num(c.score) : "—"), el("td", {}, show(c.weight)),
      el("td", {}, c.status === "ok" ? show(c.rationale) : show(c.error))));
    const read = items.filter((c) => c.status === "ok").length;
    return [el("h3", {}, `checklist (${read} of ${items.length} read)`), el("table", { id: "checklist", class: "counts" }, el("thead", {}, head), el("tbody", {}, ...rows))];
  }
  function renderSummary(s) {
    summary = s; judgeColumn = s.judge_column || "label";
    $("kind").textContent = s.kind; $("file").textContent = s.file;
    $("label-name").textContent = judgeColumn;
    const box = $("summary"); box.replaceChildren();
    box.append(el("div", { class: "card" }, el("h3", {}, "rows"), el("div", { class: "big", id: "summary-rows" }, s.rows.toLocaleString())));
    box.append(counts("status", s.status, "status"));
    if (!s.blind) box.append(counts(judgeColumn === "winner" ? "winner" : "labels", s.labels, "label")); // --blind: no judge figure
    if (Object.keys(s.error_kinds || {}).length) box.append(counts("errors by kind", s.error_kinds, "error_kind"));
    if (!s.blind) box.append(histogram("score", s.score));
    for (const [part, score] of Object.entries(s.parts || {})) box.append(histogram("score of " + part, score));
    if (s.checklist && s.checklist.length) box.append(checklistSummary(s.checklist));
    if (s.tokens) {
      box.append(el("div", { class: "card" }, el("h3", {}, "tokens"),
        el("div", {}, `prompt ${s.tokens.prompt.toLocaleString()}`), el("div", {}, `completion ${s.tokens.completion.toLocaleString()}`),
        s.cost_usd !== null && s.cost_usd !== undefined ? el("div", {}, `cost $${num(s.cost_usd, 4)}`) : null));
    }
    if (s.pairwise) {
      box.append(counts("orders agree", s.pairwise.agree), counts("decided by", s.pairwise.decided_by));
      $("flipped-box").hidden = false;
    }
    if (s.warnings && s.warnings.length) box.append(el("div", { class: "card" }, el("h3", {}, "warnings"), ...s.warnings.map((w) => el("div", {}, w))));
    // Who answered: a filter once the file holds more than one served model or fingerprint (a judge that changed mid-run).
    for (const [name, table] of [["served_model", s.served_models], ["system_fingerprint", s.system_fingerprints]])
      $(name + "-box").hidden = Object.keys(table || {}).length < 2;
    $("drift-box").hidden = !Object.keys(s.drift || {}).length;
    for (const [name, table] of [["status", s.status], ["label", s.labels], ["error_kind", s.error_kinds],
      ["served_model", s.served_models], ["system_fingerprint", s.system_fingerprints]]) {
      const select = $("filter-" + name), current = select.value;
      select.replaceChildren(el("option", { value: "" }, "any"), ...Object.keys(table || {}).map((k) => el("option", { value: k }, k)));
      select.value = current;
    }
    const sort = $("sort"), current = sort.value;
    // The report's rows come worst first (errors, then disagreements); the server's in file order.
    sort.replaceChildren(el("option", { value: "" }, MODE === "report" ? "worst first" : "file order"));
    for (const c of s.columns) sort.append(el("option", { value: c }, c + " ↑"), el("option", { value: "-" + c }, c + " ↓"));
    sort.value = current;
    renderAgreement(s.agreement);
    renderEvalRun(s);
  }
  // An Evals-API run (a file graded with --grader eval.json): its result_counts and per-criterion pass/fail, as OpenAI shows a run.
  function renderEvalRun(run) {
    const box = $("eval-run");
    if (!run.result_counts) { box.hidden = true; return; }
    box.hidden = false;
    const c = run.result_counts, judged = c.passed + c.failed;
    const head = el("tr", {}, el("th", {}, "testing criterion"), el("th", {}, "passed"), el("th", {}, "failed"), el("th", {}, "pass rate"));
    const rows = run.per_testing_criteria_results.map((r) => el("tr", {}, el("th", {}, r.testing_criteria), el("td", {}, r.passed),
      el("td", {}, r.failed), el("td", {}, r.passed + r.failed ? pct(r.passed / (r.passed + r.failed)) : "–")));
    box.replaceChildren(
      el("div", { class: "card" }, el("h3", {}, "eval run: result_counts"),
        el("div", { class: "big", id: "eval-pass-rate" }, judged ? pct(c.passed / judged) : "–"),
        el("div", { id: "eval-result-counts" }, `total ${c.total.toLocaleString()}, passed ${c.passed.toLocaleString()}, ` +
          `failed ${c.failed.toLocaleString()}, errored ${c.errored.toLocaleString()}`),
        el("div", { class: "muted" }, "a row passes when every criterion passes; an errored criterion makes the row errored, never failed")),
      el("div", { class: "card" }, el("h3", {}, "per_testing_criteria_results"),
        el("table", { class: "confusion", id: "eval-criteria" }, el("thead", {}, head), el("tbody", {}, ...rows))));
  }
  function renderAgreement(a) {
    const box = $("agreement");
    if (!a) { box.hidden = true; return; }
    box.hidden = false; $("disagree-box").hidden = false;
    const labels = a.confusion.labels;
    const head = el("tr", {}, el("th", {}, "human \\ judge"), ...labels.map((l) => el("th", {}, l)));
    const rows = a.confusion.matrix.map((row, i) =>
      el("tr", {}, el("th", {}, labels[i]), ...row.map((n, j) => el("td", { class: i === j ? "diag" : "" }, n))));
    const list = el("ul", { id: "disagreements" }, ...a.disagreements.map((d) =>
      el("li", {}, el("a", { href: "#/rows/" + d.index, "data-index": d.index },
        d.key !== null && d.key !== undefined && a.on ? `${a.on}=${d.key}` : `row ${d.index}`),
        `: human ${d.human_label}, judge ${show(d.judge_label)}`)));
    box.replaceChildren(
      el("div", { class: "card" }, el("h3", {}, "agreement with human labels"),
        el("div", { class: "big", id: "accuracy" }, pct(a.accuracy)), el("div", {}, `Cohen's kappa ${num(a.kappa)}`),
        el("div", { class: "muted" }, `${a.judged.toLocaleString()} judged of ${a.labelled.toLocaleString()} labelled, ` +
          `${a.failures.toLocaleString()} judge failures; human labels: ${a.human_source}`)),
      el("div", { class: "card" }, el("h3", {}, "confusion (rows: human)"), el("table", { class: "confusion" }, el("thead", {}, head), el("tbody", {}, ...rows))),
      el("div", { class: "card" }, el("h3", {}, `disagreements (${a.disagreed.toLocaleString()})`), list));
  }

  // ---- the rows table -------------------------------------------------------------------------
  function pickColumns(row) {
    // The judge's column: winner in a pairwise file (there "label" is the input's gold label), else label.
    const keys = Object.keys(row), judge = keys.includes("winner") ? "winner" : "label";
    const fixed = ["index", "status", judge, "score", "error_kind", "human_label", "agree"];
    const chosen = fixed.filter((k) => keys.includes(k));
    if (keys.includes("criteria_read")) chosen.push("criteria_read");
    for (const k of keys) if (!RESULT.has(k) && !isCriterionColumn(k) && !k.startsWith("input_") && chosen.length < fixed.length + 3) chosen.push(k);
    if (keys.includes("rationale")) chosen.push("rationale");
    return chosen;
  }
  function setFilter(name, value) {
    $("filter-" + name).value = value; offset = 0; load();
  }
  let generation = 0;
  async function load() {
    const mine = ++generation;
    let page;
    try { page = await source.rows(params(), offset, PAGE); } catch (e) { $("total").textContent = "error: " + e.message; return; }
    if (mine !== generation) return; // a newer request is on its way: its answer wins
    total = page.total;
    $("total").textContent = total.toLocaleString();
    $("noun").textContent = total === 1 ? "row matches" : "rows match";
    $("range").textContent = page.rows.length ? ` (showing ${(offset + 1).toLocaleString()}–${(offset + page.rows.length).toLocaleString()})` : "";
    $("state").textContent = page.ready === false ? "indexing the file for filters…" : "";
    if (!columns && page.rows.length) columns = pickColumns(page.rows[0]);
    const table = $("rows-table");
    table.tHead.replaceChildren(el("tr", {}, ...(columns || []).map((c) => el("th", { onclick: () => { const s = $("sort"); s.value = s.value === c ? "-" + c : c; offset = 0; load(); } }, c))));
    table.tBodies[0].replaceChildren(...page.rows.map((row) => el("tr", { "data-index": row.index, onclick: () => openRow(row.index) },
      ...columns.map((c) => el("td", { class: c === "status" ? "status-" + row[c] : null, title: show(row[c]).slice(0, 500) }, show(row[c]).slice(0, 200))))));
    $("prev").disabled = offset === 0; $("next").disabled = offset + PAGE >= total;
  }

  // ---- one row --------------------------------------------------------------------------------
  function section(title, ...content) { return [el("h3", {}, title), ...content]; }
  function messages(list) {
    return el("div", {}, ...list.map((m) => el("div", { class: "message" }, el("b", {}, m.role), el("pre", {}, m.content))));
  }
  // Each row has its own URL (#/rows/17): a row can be linked, bookmarked and reloaded.
  const ROW_HASH = /^#\/rows\/(\d+)$/;
  function openRow(index) {
    const target = "#/rows/" + index;
    if (location.hash !== target) location.hash = target; // the hashchange shows it
    else showRow(index);
  }
  function closeRow() {
    $("row-view").hidden = true;
    if (ROW_HASH.test(location.hash)) history.pushState(null, "", location.pathname + location.search);
  }
  function route() {
    const m = ROW_HASH.exec(location.hash);
    if (m) showRow(Number(m[1])); else $("row-view").hidden = true;
  }
  async function showRow(index) {
    let row;
    try { row = await source.row(index); } catch (e) { row = null; }
    if (!row) { $("state").textContent = `no row ${index} in this ${MODE === "report" ? "report" : "file"}`; return; }
    if (!row) return;
    $("row-title").textContent = `row ${index}`;
    const body = $("row-body"), parts = [];
    const verdict = el("dl", { id: "verdict" });
    for (const k of ["status", judgeColumn, "score", "human_label", "error_kind", "error", "decided_by", "agree"])
      if (k in row && row[k] !== null) verdict.append(el("dt", {}, k), el("dd", { class: k === "status" ? "status-" + row[k] : null }, show(row[k])));
    parts.push(...section("verdict", verdict));
    const checklist = checklistTable(row);
    if (checklist && !(row.hidden && row.hidden.includes("checklist"))) parts.push(...checklist);
    if (row.hidden && row.hidden.length) parts.push(el("p", { class: "hidden-note", id: "blind-note" },
      `blind: the judge's ${row.hidden.join(", ")} show once you have labelled this row`));
    if ("winner_ab" in row) {
      const order = (sfx, title) => el("div", {}, el("h3", {}, title), el("dl", {}, ...["winner", "label", "score", "rationale", "raw_reply"].flatMap((k) =>
        (k + "_" + sfx) in row ? [el("dt", {}, k), el("dd", {}, show(row[k + "_" + sfx]))] : [])));
      parts.push(el("div", { class: "orders", id: "orders" }, order("ab", "input order (ab)"), order("ba", "swapped order (ba)")));
    } else if (row.rationale) parts.push(...section("rationale", el("pre", { id: "rationale" }, row.rationale)));
    // gradekit grade --keep-reasoning: the judge's thinking, shown apart (it is never read for the verdict).
    if (row.reasoning) parts.push(...section("judge's thinking (not read for the verdict)", el("pre", { id: "reasoning" }, row.reasoning)));
    const pair = "winner_ab" in row;  // a pairwise row shows raw_reply_ab / raw_reply_ba in its orders
    const raw = RAW.filter((k) => k in row && row[k] !== null && !(pair && (k === "raw_reply_ab" || k === "raw_reply_ba")));
    if (!(row.hidden && row.hidden.some((k) => RAW.includes(k)))) parts.push(...section("raw reply", raw.length ? el("pre", { id: "raw-reply" }, raw.map((k) => show(row[k])).join("\n\n"))
      : el("p", { id: "raw-reply", class: "muted" }, RAW.some((k) => k in row)
        ? (pair ? "kept per order above when an order failed" : "none kept: the verdict was read (the raw reply is kept for failed verdicts)")
        : row.error ? `not stored in this output; the error says: ${row.error}` : "not stored in this output (it has no raw column)")));
    const inputs = el("dl", { id: "inputs" });
    for (const [k, v] of Object.entries(row)) if (!RESULT.has(k) && !isCriterionColumn(k)) inputs.append(el("dt", {}, k), el("dd", {}, show(v)));
    parts.push(...section("input columns", inputs));
    const other = el("dl", {});
    for (const k of ["prompt_tokens", "completion_tokens", "cached"]) if (k in row) other.append(el("dt", {}, k), el("dd", {}, show(row[k])));
    parts.push(...section("tokens", other));
    const prompt = el("div", { id: "prompt" }, el("p", { class: "muted" }, MODE === "server" ? "rendering…" : "not in the report"));
    parts.push(...section("judge prompt", prompt));
    body.replaceChildren(...parts);
    $("row-view").hidden = false;
    labelling.shown(row);
    let rendered;
    try { rendered = await source.prompt(index); } catch (e) {  // the server stopped, or the network failed
      prompt.replaceChildren(el("p", { class: "muted" }, "prompt not fetched: " + e.message)); return;
    }
    if (!rendered) prompt.replaceChildren(el("p", { class: "muted" },
      MODE === "report" ? "not in the report" : "start `gradekit view` with --rubric NAME to see it"));
    else if (rendered.error) prompt.replaceChildren(el("p", {}, `rubric ${rendered.rubric}: ${rendered.error}`));
    else if (rendered.messages_ba) prompt.replaceChildren(el("div", { class: "orders" },
      el("div", {}, el("h3", {}, "ab"), messages(rendered.messages)), el("div", {}, el("h3", {}, "ba"), messages(rendered.messages_ba))));
    else prompt.replaceChildren(messages(rendered.messages));
  }

  // ---- wiring ---------------------------------------------------------------------------------
  $("filters").addEventListener("change", () => { offset = 0; load(); });
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); offset = 0; load(); });
  let typing = null;
  $("filter-q").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => { offset = 0; load(); }, 300); });
  $("filters").addEventListener("reset", () => setTimeout(() => { offset = 0; load(); }, 0));
  $("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); load(); });
  $("next").addEventListener("click", () => { if (offset + PAGE < total) { offset += PAGE; load(); } });
  $("close").addEventListener("click", closeRow);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && !$("row-view").hidden) closeRow(); });
  const labelling = setupLabelling();
  window.addEventListener("hashchange", route);
  window.addEventListener("popstate", route);
  load();
  route(); // a bookmarked or reloaded #/rows/N opens its row
  source.summary().then((s) => {
    renderSummary(s);
    // The summary comes once the copy is done: the first page's "indexing" note no longer holds.
    if (MODE === "server" && $("state").textContent.startsWith("indexing")) $("state").textContent = "";
  }, (e) => { $("state").textContent = "summary failed: " + e.message; });
  if (MODE === "report") $("state").textContent = DATA.note || "";

  // ---- labelling mode (gradekit view --annotate) ------------------------------------------------
  // The open row is the one being labelled: digits label it (then the next row is drawn), j/k move,
  // u undoes this tab's last label. Writes carry the page's token and a JSON body (see _annotate.py).
  function setupLabelling() {
    const mode = document.body.dataset.annotate || "";
    if (MODE !== "server" || !mode) return { shown: () => {} };
    const token = document.body.dataset.token || "";
    let values = [], current = null, done = [];
    $("labelling").hidden = false; $("label-panel").hidden = false;
    if (mode === "blind") for (const id of ["filter-label", "filter-score_min"]) $(id).closest("label").hidden = true; // refused (400) while blind
    async function post(index, label) {
      const response = await fetch("/api/rows/" + index + "/label", {
        method: "POST", headers: { "Content-Type": "application/json", "X-Gradekit-Token": token },
        body: JSON.stringify({ label, note: label === null ? null : ($("label-note").value.trim() || null) }),
      });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      return body;
    }
    async function progress() {
      const p = await api("/api/labels");
      values = p.values;
      $("label-progress").textContent = `${p.labelled.toLocaleString()} / ${p.total.toLocaleString()}`;
      $("label-ppi").textContent = p.ppi ? `PPI ${num(p.ppi.estimate)} [${num(p.ppi.ci_low)}, ${num(p.ppi.ci_high)}] (${p.ppi.method})`
        : (p.ppi_error ? "PPI: " + p.ppi_error : "PPI: label 2 rows or more");
      renderButtons();
      return p;
    }
    function renderButtons() {
      const chosen = current ? current.human_label : null;
      $("label-buttons").replaceChildren(...values.map((v, i) => el("button", {
        type: "button", "data-label": v, class: v === chosen ? "chosen" : null, onclick: () => choose(v),
      }, `${i + 1} ${v}`)));
    }
    async function next() {
      const before = location.hash;
      try {
        const drawn = await api("/api/next?strategy=" + $("label-strategy").value);
        // Opened a row meanwhile (a link, j/k, the back button): that choice stands, the draw is dropped.
        if (location.hash !== before) return;
        openRow(drawn.index);
      } catch (e) { $("label-status").textContent = e.message; }
    }
    async function choose(label) {
      if (!current) return;
      const index = current.index;
      try {
        await post(index, label);
        done.push(index);
        $("label-status").textContent = `row ${index}: ${label}`;
        $("label-note").value = "";
        await progress();
        load();
        await next();
      } catch (e) { $("label-status").textContent = "not saved: " + e.message; }
    }
    async function undo() {
      const index = done.pop();
      if (index === undefined) { $("label-status").textContent = "nothing to undo in this tab"; return; }
      try {
        await post(index, null);
        $("label-status").textContent = `row ${index}: label undone`;
        await progress(); load(); openRow(index);
      } catch (e) { $("label-status").textContent = "undo failed: " + e.message; }
    }
    $("label-next").addEventListener("click", next);
    document.addEventListener("keydown", (e) => {
      const target = e.target;
      if (e.ctrlKey || e.metaKey || e.altKey || (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT"))) return;
      if (/^[1-9]$/.test(e.key) && current && values[Number(e.key) - 1] !== undefined) { e.preventDefault(); choose(values[Number(e.key) - 1]); }
      else if (e.key === "j" && current) openRow(current.index + 1);
      else if (e.key === "k" && current && current.index > 0) openRow(current.index - 1);
      else if (e.key === "u") undo();
      else if (e.key === "n") next();
    });
    progress().then(() => { if (!ROW_HASH.test(location.hash)) next(); }, (e) => { $("label-status").textContent = e.message; });
    return {
      shown(row) {
        current = row;
        $("label-status").textContent = row.labelled ? `labelled: ${row.human_label}` + (row.human_note ? ` (${row.human_note})` : "") : "not labelled yet";
        renderButtons();
      },
    };
  }
})();
