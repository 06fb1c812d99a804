// kvbudget web: the page's controls, its state in the URL, and its SVG charts. Every number comes from the
// server's /api/ answers (the CLI's --json); this script only formats and draws them.
"use strict";

const $ = (id) => document.getElementById(id);
const VIEWS = ["plan", "compare", "simulate", "recommend", "quality"];
const FIELDS = ["model", "compare", "engine", "kv_dtype", "gpu", "gpu_memory", "tp", "pp", "max_model_len",
  "concurrency", "trace", "rate", "requests", "rate_scale", "slice", "max_concurrency", "replicas", "router", "guard",
  "expert_parallel", "report"];
const DEFAULTS = { view: "plan", model: "llama-3.1-8b", engine: "vllm", kv_dtype: "auto", gpu: "H100-80GB",
  tp: "1", pp: "1", concurrency: "1", trace: "azure-conv-2023", rate_scale: "1", slice: "0:2000",
  rec_slo: "ttft_p99=2s,tpot_p99=50ms", rec_max_gpus: "2", rec_tp: "1,2" };
// the search's own controls (recommend): RecommendRequest's options from /api/choices, kept as rec_NAME in the
// state and the URL (tp and kv_dtype there are lists, not the plan's one value) and sent as NAME
let SEARCH = [];
const REC = "rec_";
const searchKeys = () => SEARCH.map((o) => REC + o.name);
let CHART_ENGINES = [];  // engines with a KV budget: the servers, from /api/choices (hf has none)
const COLORS = ["var(--c0)", "var(--c1)", "var(--c2)", "var(--c3)", "var(--c4)"];
const DASHES = ["", "7 4", "2 3", "10 3 2 3", "4 4"];
// an error's field, as the API names it, and the control that shows it
const FIELD_OF = { context: "max_model_len", batch: "concurrency", models: "model", kind: "model" };

let state = {};
let choices = null;
const maxLen = new Map();  // model -> its maximum context (from /api/estimate)
let generation = 0;  // answers to an older state are dropped

// ---- numbers, as the CLI prints them -------------------------------------------------------------------------
const UNITS = [["EiB", 2 ** 60], ["PiB", 2 ** 50], ["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
function fmtBytes(n) {
  for (const [unit, size] of UNITS) {
    if (Math.abs(n) >= size) {
      const v = n / size;
      return Math.abs(v) < 10000 ? `${fixed(v, 2)} ${unit}` : `${v.toPrecision(3)} ${unit}`;
    }
  }
  return `${Math.trunc(n).toLocaleString("en-US")} B`;
}
const fixed = (v, d) => v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
const int = (v) => Math.round(v).toLocaleString("en-US");
const times = (v) => `${v.toFixed(2)}x`;
const pct = (v) => `${(v * 100).toFixed(1)}%`;
function ms(s) { return s == null ? "–" : s < 1 ? `${fixed(s * 1000, 1)} ms` : `${fixed(s, 2)} s`; }
function tokens(n) {  // axis labels: 4k, 128k, 1M (powers of 1024, as contexts are written)
  if (n >= 2 ** 20) return `${+(n / 2 ** 20).toFixed(1)}M`;
  if (n >= 1024) return `${+(n / 1024).toFixed(1)}k`;
  return String(n);
}

// ---- small DOM helpers ---------------------------------------------------------------------------------------
function h(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid != null && kid !== false) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}
const NS = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, ...kids) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) e.setAttribute(k, v);
  for (const kid of kids.flat()) if (kid != null) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}
const badge = (kind, title) => h("span", { class: `badge ${kind}`, title }, kind);
const exactBadge = (exact) => exact ? badge("exact", "computed from the engine's allocator rules")
  : badge("estimate", "an estimate: see the notes");
function card(label, value, extra, id) {
  return h("div", { class: "card" }, h("div", { class: "k" }, label, " ", extra),
    h("div", { class: "v", "data-value": id }, value));
}
function table(headers, rows, numeric = []) {
  return h("div", { class: "scroll" }, h("table", {},
    h("thead", {}, h("tr", {}, headers.map((x, i) => h("th", { class: numeric.includes(i) ? "n" : null, scope: "col" }, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((x, i) => h("td", { class: numeric.includes(i) ? "n" : null }, x)))))));
}

// ---- state in the URL ----------------------------------------------------------------------------------------
function readURL() {
  const q = new URLSearchParams(location.search);
  state = { ...DEFAULTS };
  if (q.toString()) for (const k of [...FIELDS, ...Object.keys(DEFAULTS).filter((d) => d.startsWith(REC))]) if (!["engine", "kv_dtype"].includes(k)) state[k] = "";  // a link says what it means
  for (const [k, v] of q) if (k === "view" || FIELDS.includes(k) || k.startsWith(REC)) state[k] = v;
  if (!VIEWS.includes(state.view)) state.view = "plan";
}
function writeURL() {
  const q = new URLSearchParams({ view: state.view });
  for (const k of [...FIELDS, ...searchKeys()]) if (state[k]) q.set(k, state[k]);
  history.replaceState(null, "", `?${q}`);
}
function toControls() {
  for (const k of [...FIELDS, ...searchKeys()]) {
    const e = $(k === "compare" ? "compare-models" : k);
    if (!e) continue;
    if (e.type === "checkbox") e.checked = ["1", "true", "on"].includes(state[k]);
    else e.value = state[k] || "";
  }
  syncSlider();
  showView();
}
function fromControl(e) {
  const k = e.id === "compare-models" ? "compare" : e.id;
  state[k] = e.type === "checkbox" ? (e.checked ? "1" : "") : e.value.trim();
}

// ---- talking to the API --------------------------------------------------------------------------------------
async function api(path, params) {
  const r = await fetch(`/api/${path}${params ? `?${params}` : ""}`);
  const body = await r.json().catch(() => ({ error: `the server answered ${r.status}` }));
  if (!r.ok) throw Object.assign(new Error(body.error), { body, status: r.status });
  return body;
}
function params(keys, extra = {}) {
  const p = new URLSearchParams();
  p.append("model", state.model);
  for (const k of keys) if (state[k]) p.set(k, state[k]);
  for (const [k, v] of Object.entries(extra)) if (v != null && v !== "") p.set(k, v);
  return p;
}
const PLAN_KEYS = ["engine", "kv_dtype", "gpu", "gpu_memory", "tp", "pp", "max_model_len", "concurrency"];

function clearErrors() {
  for (const e of document.querySelectorAll(".error")) { e.hidden = true; e.textContent = ""; }
  for (const e of document.querySelectorAll("[aria-invalid]")) e.removeAttribute("aria-invalid");
}
function showError(err) {
  const body = err.body || { error: err.message };
  let field = FIELD_OF[body.field] || body.field;
  if (state.view === "recommend" && field && $(`${REC}${field}-error`)) field = REC + field;  // the search's list
  const box = field && $(`${field}-error`);
  if (box) {
    box.textContent = body.error;
    box.hidden = false;
    const input = $(field === "compare" ? "compare-models" : field);
    if (input) input.setAttribute("aria-invalid", "true");
  } else {
    $("top-error").textContent = body.error;
    $("top-error").hidden = false;
  }
}
function busy(text) {
  $("status").textContent = text;
  $("status").classList.toggle("busy", Boolean(text));
  $("results").setAttribute("aria-busy", text ? "true" : "false");
}

// ---- charts --------------------------------------------------------------------------------------------------
// drawn at the width they are shown (text stays 12px on a phone); the results column's width
const chartWidth = () => Math.max(300, Math.min(760, ($("results").clientWidth || 720) - 4));
function niceStep(span, count) {
  const raw = span / Math.max(count, 1), mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * mag) return m * mag;
  return 10 * mag;
}
function byteUnit(max) {
  for (const [unit, size] of UNITS) if (max >= size) return [unit, size];
  return ["B", 1];
}
// A line chart: x on a log-2 axis (tokens) or linear (seconds); y linear. Returns an <svg>.
function lineChart({ title, xs, xLog, xLabel, yMax, yFormat, yLabel, series, hlines = [], width = chartWidth(), height = 300, yUnit = 1, yWhole = false }) {
  const m = { l: 58, r: 12, t: 14, b: 42 }, W = width - m.l - m.r, H = height - m.t - m.b;
  const [x0, x1] = xs;
  const fx = xLog ? (v) => m.l + (Math.log2(v) - Math.log2(x0)) / (Math.log2(x1) - Math.log2(x0) || 1) * W
    : (v) => m.l + (v - x0) / ((x1 - x0) || 1) * W;
  const fy = (v) => m.t + H - (v / (yMax || 1)) * H;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title },
    s("title", {}, title));
  const grid = s("g", { class: "grid" }), axis = s("g", { class: "axis" });
  const step = Math.max(niceStep(yMax / yUnit, 5) * yUnit, yWhole ? 1 : 0);  // (counts: whole ticks)
  for (let v = 0; v <= yMax * 1.0001; v += step) {
    grid.append(s("line", { x1: m.l, x2: m.l + W, y1: fy(v), y2: fy(v) }));
    axis.append(s("text", { x: m.l - 6, y: fy(v) + 4, "text-anchor": "end" }, yFormat(v)));
  }
  const xticks = [];
  if (xLog) { for (let e = Math.ceil(Math.log2(x0)); e <= Math.log2(x1) + 1e-9; e++) xticks.push(2 ** e); }
  else { const st = niceStep(x1 - x0, 6); for (let v = Math.ceil(x0 / st) * st; v <= x1 + 1e-9; v += st) xticks.push(v); }
  const every = Math.max(1, Math.ceil(xticks.length / Math.max(3, Math.floor(W / 80))));
  xticks.forEach((v, i) => {
    grid.append(s("line", { x1: fx(v), x2: fx(v), y1: m.t, y2: m.t + H }));
    if (i % every === 0) axis.append(s("text", { x: fx(v), y: m.t + H + 16, "text-anchor": "middle" },
      xLog ? tokens(v) : `${+v.toFixed(1)}`));
  });
  axis.append(s("line", { x1: m.l, x2: m.l + W, y1: m.t + H, y2: m.t + H }));
  axis.append(s("line", { x1: m.l, x2: m.l, y1: m.t, y2: m.t + H }));
  axis.append(s("text", { x: m.l + W / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
  axis.append(s("text", { x: 12, y: m.t + H / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${m.t + H / 2})` }, yLabel));
  svg.append(grid, axis);
  let lastLabel = -Infinity;
  for (const line of [...hlines].sort((a, b) => a.y - b.y)) {
    if (!(line.y > 0) || line.y > yMax) continue;
    svg.append(s("line", { x1: m.l, x2: m.l + W, y1: fy(line.y), y2: fy(line.y), stroke: line.color,
      "stroke-width": 1.5, "stroke-dasharray": "6 4", "data-budget": line.name }));
    if (lastLabel - fy(line.y) >= 14 || lastLabel === -Infinity) {  // labels that would overlap are left to the legend
      svg.append(s("text", { x: m.l + 6, y: fy(line.y) - 4, class: "budget" }, line.label));
      lastLabel = fy(line.y);
    }
  }
  for (const se of series) {
    const pts = se.points.filter(([x, y]) => x >= x0 && x <= x1 && y != null);
    if (!pts.length) continue;
    const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${fx(x).toFixed(1)},${fy(Math.min(y, yMax * 1.02)).toFixed(1)}`).join("");
    svg.append(s("path", { d, fill: "none", stroke: se.color, "stroke-width": se.width || 2,
      "stroke-dasharray": se.dash || null, "data-series": se.name }));
  }
  return svg;
}
function legend(items) {
  return h("ul", { class: "legend" }, items.map((it) => h("li", {},
    (() => { const sw = s("svg", { width: 26, height: 12, "aria-hidden": "true" });
      sw.append(it.box ? s("rect", { x: 1, y: 1, width: 24, height: 10, fill: it.color })
        : s("line", { x1: 0, x2: 26, y1: 6, y2: 6, stroke: it.color, "stroke-width": it.width || 2.5, "stroke-dasharray": it.dash || null }));
      return sw; })(), it.label, it.extra || null)));
}

// Memory of one GPU as one stacked bar (the plan's stack).
function stackChart(plan) {
  const total = plan.gpu_memory_bytes;
  const terms = plan.stack.filter((t) => t.key !== "gpu" && t.key !== "share" && t.bytes > 0);
  const used = terms.reduce((a, t) => a + t.bytes, 0);
  const rest = Math.max(0, total - used);
  const parts = [...terms.map((t, i) => ({ ...t, color: COLORS[i % COLORS.length] })),
    ...(rest > 0 ? [{ key: "rest", name: "left outside the engine's share", bytes: rest, color: "#c9ced4", light: true }] : [])];
  const width = chartWidth(), W = width - 2, height = 46;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `Memory of one GPU, ${fmtBytes(total)}: ` + parts.map((p) => `${p.name} ${fmtBytes(p.bytes)}`).join(", ") },
    s("title", {}, "Memory of one GPU"));
  let x = 1;
  for (const p of parts) {
    const w = (p.bytes / Math.max(total, used)) * W;
    svg.append(s("rect", { x, y: 4, width: Math.max(w, 0), height: 30, fill: p.color, stroke: "#fff", "stroke-width": 1,
      "data-term": p.key }, s("title", {}, `${p.name}: ${fmtBytes(p.bytes)}`)));
    if (w > 70) svg.append(s("text", { x: x + 5, y: 24, class: p.light ? "onlight" : "onbar" }, fmtBytes(p.bytes)));
    x += w;
  }
  const fig = h("figure", {}, svg, legend(parts.map((p) => ({ box: true, color: p.color,
    label: `${p.name}: ${fmtBytes(p.bytes)}`, extra: p.estimate ? badge("estimate", p.note) : null }))),
  h("figcaption", {}, `One GPU's ${fmtBytes(total)} (${plan.gpu}): what the engine's share holds before the KV cache, and the KV budget left.`));
  return fig;
}

// ---- the plan view -------------------------------------------------------------------------------------------
async function renderPlan(gen) {
  const view = $("view-plan");
  const plan = await api("plan", params(PLAN_KEYS));
  if (gen !== generation) return;
  view.replaceChildren(...planSummary(plan));
  if (!plan.capacity) return;  // no KV budget: the answer says what to change
  // KV against context for every engine, with each engine's budget line
  const chartBox = h("div", { id: "kv-chart" }, h("p", { class: "status busy" }, "drawing KV against context…"));
  view.insertBefore(chartBox, view.querySelector("#recommendations"));
  await drawKVChart(chartBox, plan, gen);
}

function planSummary(plan) {
  const out = [];
  const fits = plan.fits !== false && plan.capacity && plan.capacity.fits;
  out.push(h("h2", {}, `${plan.model} on ${plan.gpu} ×${plan.gpus || plan.tp * plan.pp} with ${plan.engine}`));
  if (!plan.capacity) {
    out.push(h("p", { class: "verdict nofit", "data-value": "verdict" }, "Does not fit: the weights and the engine's other memory leave no KV budget"));
    out.push(h("h3", {}, "Memory of one GPU"), stackChart({ ...plan, gpu_memory_bytes: plan.stack.find((t) => t.key === "gpu")?.bytes || 0 }));
    out.push(recommendations(plan.recommendations));
    return out;
  }
  const cap = plan.capacity;
  out.push(h("p", { class: `verdict ${fits ? "fits" : "nofit"}`, "data-value": "verdict" }, fits
    ? `Fits: ${times(cap.max_concurrency)} requests of ${int(cap.max_model_len)} tokens at once`
    : `One request of ${int(cap.max_model_len)} tokens does not fit; the longest that does: ${int(cap.estimated_max_model_len)}`));
  const budgetEstimate = plan.stack.some((t) => t.key === "kv" && t.estimate);
  out.push(h("div", { class: "summary" },
    card("KV budget per GPU", fmtBytes(plan.kv_memory_bytes), budgetEstimate ? badge("estimate", "GPU memory less estimated weights, activations and overhead") : badge("exact", "given"), "kv_memory_bytes"),
    card("Requests at once", times(cap.max_concurrency), exactBadge(plan.exact), "max_concurrency"),
    card(`KV cache size (as ${plan.engine} reports it)`, `${int(cap.kv_cache_tokens)} tokens`, exactBadge(plan.exact), "kv_cache_tokens"),
    cap.num_blocks != null ? card("Blocks", `${int(cap.num_blocks)} × ${cap.block_size}`, exactBadge(plan.exact), "num_blocks") : null,
    plan.longest_context_for_concurrency ? card(`Longest context for ${plan.concurrency} request(s)`, `${int(plan.longest_context_for_concurrency)} tokens`, exactBadge(plan.exact), "longest_context") : null,
    card("Token tax", `${fmtBytes(plan.bytes_per_token)} / token`, exactBadge(plan.exact), "bytes_per_token")));
  out.push(h("h3", {}, "Memory of one GPU"), stackChart(plan));
  out.push(recommendations(plan.recommendations));
  out.push(h("h3", {}, "Degradation levels (for kvbudget guard)"),
    table(["level", "at", "KV bytes", "tokens", "requests", "what the guard does"],
      plan.degradation.map((l) => [l.name, `${Math.round(l.fraction * 100)}%`, fmtBytes(l.kv_bytes), int(l.tokens), int(l.requests), l.meaning]), [1, 2, 3, 4]),
    h("p", {}, h("a", { class: "button", id: "guard-yaml", href: `/api/guard.yaml?${params(PLAN_KEYS)}`, download: "guard.yaml" }, "Download the guard YAML")));
  if (plan.roofline && plan.roofline.length) {
    out.push(h("h3", {}, "Decode step ", badge("estimate", "a lower bound from datasheet bandwidth")),
      table(["context", "step", "tokens/s per sequence", "tokens/s total"],
        plan.roofline.map((r) => [int(r.context), ms(r.step_seconds), fixed(r.tokens_per_second, 1), fixed(r.aggregate_tokens_per_second, 1)]), [0, 1, 2, 3]));
  }
  out.push(notes(plan.notes));
  return out;
}

const APPLIES = { tp: "tp", pp: "pp", kv_dtype: "kv_dtype", max_model_len: "max_model_len", gpu: "gpu", model: "model", engine: "engine" };
function recommendations(recs) {
  const box = h("div", { id: "recommendations" }, h("h3", {}, "What to change (cheapest first)"));
  if (!recs || !recs.length) { box.append(h("p", {}, "Nothing to change: no larger tensor parallel size or GPU would help.")); return box; }
  box.append(h("ol", { class: "recs" }, recs.map((r) => {
    const keys = Object.keys(r.parameters);
    const can = keys.every((k) => APPLIES[k]);
    return h("li", {}, h("strong", {}, r.change), ` (${r.cost}): ${r.effect}`, can ? h("button", { type: "button", onclick: () => {
      for (const k of keys) state[APPLIES[k]] = String(r.parameters[k]);
      toControls(); update();
    } }, "apply") : null);
  })));
  return box;
}
function notes(list) {
  return list && list.length ? h("div", {}, h("h3", {}, "Notes"), h("ul", { class: "notes" }, list.map((n) => h("li", {}, n)))) : "";
}

async function drawKVChart(box, plan, gen) {
  const model = state.model;
  const base = { kv_dtype: state.kv_dtype, tp: state.tp, pp: state.pp, batch: state.concurrency || "1" };
  if (!maxLen.has(model)) {
    const first = await api("estimate", params(["kv_dtype", "tp", "pp"], { engine: "hf" }));
    maxLen.set(model, first.max_position_embeddings);
  }
  const top = Math.max(maxLen.get(model), plan.capacity.max_model_len, 2048);
  const contexts = [];
  for (let e = 8; 2 ** e < top; e += 0.5) contexts.push(Math.round(2 ** e));
  contexts.push(top);
  const results = await Promise.all(CHART_ENGINES.map(async (engine) => {
    try {
      const [est, pl] = await Promise.all([
        api("estimate", params([], { ...base, engine, context: contexts.join(",") })),
        engine === plan.engine ? plan : api("plan", params(PLAN_KEYS, { engine }))]);
      const kv = (pl.stack || []).find((t) => t.key === "kv");
      return { engine, est, budget: pl.kv_memory_bytes, budgetExact: Boolean(kv && !kv.estimate) };
    } catch (err) { return { engine, error: err.message }; }
  }));
  if (gen !== generation) return;
  const ok = results.filter((r) => !r.error);
  const highest = Math.max(1, ...ok.flatMap((r) => r.est.points.map((p) => p.kv_bytes)));
  const budgets = Math.max(0, ...ok.map((r) => r.budget || 0));
  // up to three times the largest budget: where the lines cross the budgets stays readable
  const yMax = (budgets ? Math.max(Math.min(highest, 3 * budgets), budgets) : highest) * 1.05;
  const [unit, size] = byteUnit(yMax);
  const series = ok.map((r) => { const i = CHART_ENGINES.indexOf(r.engine);
    return { name: r.engine, color: COLORS[i], dash: DASHES[i], width: r.engine === plan.engine ? 3.5 : 2,
      points: r.est.points.map((p) => [p.context, p.kv_bytes]) }; });
  const hlines = ok.map((r) => ({ y: r.budget, name: r.engine, color: COLORS[CHART_ENGINES.indexOf(r.engine)], label: `${r.engine} budget` }));
  const n = base.batch;
  const svg = lineChart({ title: `KV cache held by ${n} request(s) against context, per engine, with each engine's KV budget`,
    xs: [256, top], xLog: true, xLabel: "context (tokens per request)", yMax, yLabel: `KV cache (${unit})`,
    yFormat: (v) => `${+(v / size).toFixed(2)}`, yUnit: size, series, hlines });
  box.replaceChildren(h("h3", {}, `KV cache against context (${n} request${n === "1" ? "" : "s"} at once)`),
    h("figure", {}, svg, legend([...ok.map((r) => { const i = CHART_ENGINES.indexOf(r.engine);
      return { color: COLORS[i], dash: DASHES[i], width: r.engine === plan.engine ? 3.5 : 2,
        label: `${r.engine}${r.engine === plan.engine ? " (chosen)" : ""}: ${fmtBytes(r.est.bytes_per_token)}/token `,
        extra: h("span", {}, exactBadge(r.est.exact), `, budget ${fmtBytes(r.budget)} `, exactBadge(r.budgetExact)) }; })]),
    h("figcaption", {}, "Lines: what each engine allocates; dashed lines across: its KV budget on this GPU (where a line crosses its budget, requests stop fitting)."),
    results.filter((r) => r.error).length ? h("ul", { class: "notes" }, results.filter((r) => r.error).map((r) => h("li", {}, `${r.engine}: ${r.error}`))) : ""));
}

// ---- the compare view ----------------------------------------------------------------------------------------
async function renderCompare(gen) {
  const view = $("view-compare");
  const others = (state.compare || "").split(",").map((x) => x.trim()).filter(Boolean);
  const out = [];
  if (others.length) {
    const p = new URLSearchParams();
    for (const m of [state.model, ...others]) p.append("model", m);
    for (const k of ["engine", "kv_dtype", "gpu", "gpu_memory", "tp"]) if (state[k]) p.set(k, state[k]);
    if (state.max_model_len) p.set("context", state.max_model_len);
    let rows;
    try { rows = await api("compare", p); } catch (err) {
      if (err.body && err.body.field === "model" && err.body.error && others.some((o) => err.body.error.includes(o))) err.body.field = "compare";
      throw err;
    }
    if (gen !== generation) return;
    const gpu = Boolean(state.gpu || state.gpu_memory);
    out.push(h("h2", {}, `Models on ${state.engine}, requests of ${int(rows[0].context)} tokens`));
    const max = Math.max(...rows.map((r) => r.kv_bytes_at_context));
    out.push(h("figure", {}, barChart(rows.map((r) => [r.model, r.kv_bytes_at_context])),
      h("figcaption", {}, `KV cache of one request of ${int(rows[0].context)} tokens (${fmtBytes(max)} at most).`)));
    if (gpu) out.push(h("p", { class: "help" }, "Longest request, in both tables: the longest single request that fits on the GPU, up to the model's maximum. KV budgets are estimates."));
    out.push(table(["model", "cache layers", "per token", "fixed per seq", "one request", ...(gpu ? ["KV budget", "requests at once", "longest request"] : [])],
      rows.map((r) => [r.model, Object.entries(r.cache).map(([k, n]) => `${n} ${k.split("_")[0]}`).join(", "),
        fmtBytes(r.bytes_per_token), fmtBytes(r.fixed_bytes_per_sequence), fmtBytes(r.kv_bytes_at_context),
        ...(gpu ? (r.kv_memory_bytes ? [fmtBytes(r.kv_memory_bytes), times(r.max_concurrency), r.longest_context ? int(r.longest_context) : "–"] : [r.budget, "–", "–"]) : [])]),
      gpu ? [2, 3, 4, 5, 6, 7] : [2, 3, 4]));
    out.push(notes(rows.filter((r) => r.note).map((r) => `${r.model}: ${r.note}`)));
  } else {
    out.push(h("p", { class: "help" }, "Name models to compare with (left), or compare engines below."));
  }
  view.replaceChildren(...out, h("h2", {}, `Engines for ${state.model}`), h("p", { class: "status busy" }, "planning on every engine…"));
  // "longest single request" as in the models table: one request, up to the model's maximum (not the context asked)
  const single = (engine) => { const q = params(PLAN_KEYS, { engine, concurrency: "1" }); q.delete("max_model_len"); return q; };
  const plans = await Promise.all([...CHART_ENGINES, "hf"].map((engine) => Promise.all([api("plan", params(PLAN_KEYS, { engine })),
    api("plan", single(engine)).catch(() => null)])
    .then(([p, one]) => ({ engine, p, longest: one && one.longest_context_for_concurrency }), (err) => ({ engine, error: err.message }))));
  if (gen !== generation) return;
  view.lastChild.replaceWith(table(["engine", "KV budget", "blocks", "KV cache size", "requests at once", "longest request", ""],
    plans.map(({ engine, p, longest, error }) => error ? [engine, h("span", { class: "error" }, error), "", "", "", "", ""]
      : !p.capacity ? [engine, "no KV budget", "–", "–", "–", "–", ""]
        : [h("span", {}, `${engine} `, exactBadge(p.exact)), h("span", {}, `${fmtBytes(p.kv_memory_bytes)} `,
            p.stack.some((t) => t.key === "kv" && t.estimate) ? badge("estimate", "GPU memory less estimated weights, activations and overhead") : null),
          p.capacity.num_blocks != null ? `${int(p.capacity.num_blocks)} × ${p.capacity.block_size}` : "–",
          `${int(p.capacity.kv_cache_tokens)} tokens`, times(p.capacity.max_concurrency),
          longest ? int(longest) : "–",
          p.capacity.fits ? "fits" : "does not fit"]), [1, 2, 3, 4, 5]));
}
// Horizontal bars: [label, value] pairs, values written with `format`.
function barChart(items, format = fmtBytes) {
  const width = chartWidth(), rowH = 26, left = Math.min(170, width * 0.35), W = width - left - 80, height = items.length * rowH + 8;
  const max = Math.max(1e-12, ...items.map(([, v]) => v));
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": items.map(([k, v]) => `${k} ${format(v)}`).join(", ") });
  items.forEach(([k, v], i) => {
    const y = 4 + i * rowH;
    svg.append(s("text", { x: left - 8, y: y + 16, "text-anchor": "end" }, k.length > 24 ? `${k.slice(0, 23)}…` : k),
      s("rect", { x: left, y: y + 3, width: (v / max) * W, height: rowH - 8, fill: COLORS[i % COLORS.length] }),
      s("text", { x: left + (v / max) * W + 6, y: y + 16 }, format(v)));
  });
  return svg;
}

// ---- the simulation view -------------------------------------------------------------------------------------
const SIM_KEYS = ["engine", "kv_dtype", "gpu", "gpu_memory", "tp", "pp", "max_model_len", "rate", "requests",
  "rate_scale", "slice", "max_concurrency", "replicas", "router", "guard", "expert_parallel"];
async function renderSimulate(gen, run) {
  const view = $("view-simulate");
  if (!run) {
    if (!view.childElementCount) view.append(h("p", { class: "help" }, "Choose the traffic (left) and run the simulation."));
    else if (!view.querySelector(".stale")) view.prepend(h("p", { class: "stale error" }, "The settings changed: run the simulation again."));
    return;
  }
  const p = params(SIM_KEYS, { trace: state.rate ? "" : state.trace });
  busy(`Simulating (up to ${choices ? choices.limits.simulate_seconds : 60} s)…`);
  const sim = await api("simulate", p);
  if (gen !== generation) return;
  const credit = !state.rate && choices && (choices.traces.find((t) => t.name === state.trace) || {}).credit;
  if (sim.fleet) { view.replaceChildren(...fleetView(sim, credit)); return; }
  const st = sim.setup;
  const out = [h("h2", {}, `${st.model} on ${st.engine}, ${st.gpu || "no GPU named"}`)];
  out.push(h("p", {}, (st.allocator === "paged" ? `${int(st.num_blocks)} blocks of ${st.block_size} tokens`
    : `${st.allocator} allocator`) + `; max_num_seqs ${st.max_num_seqs}, max_num_batched_tokens ${int(st.max_num_batched_tokens)}, prefix caching ${st.prefix_caching ? "on" : "off"}`));
  out.push(h("div", { class: "summary" },
    card("Requests", `${int(sim.completed)} of ${int(sim.requests)}`, "", "completed"),
    card("Simulated time", `${fixed(sim.duration_s, 1)} s`, sim.clients ? `from ${int(sim.clients)} clients in a closed loop` : "", "duration"),
    card("Throughput", `${fixed(sim.requests_per_s, 2)} req/s`, badge("estimate", `times: ${st.time_model.basis || "estimated"}`), "requests_per_s"),
    card("Peak KV usage", pct(sim.peak_usage), badge("exact", "the allocator's blocks"), "peak_usage"),
    card("Preemptions", int(sim.preemptions), "", "preemptions"),
    card("Peak waiting", int(sim.peak_waiting), "", "peak_waiting")));
  out.push(h("h3", {}, "Latency ", badge("estimate", `times: ${st.time_model.basis || "estimated"}`)),
    table(["", "p50", "p90", "p99", "mean", "max", "true mean likely"], [["time to first token", sim.ttft_s], ["time per output token", sim.tpot_s], ["end to end", sim.e2e_s]]
      .filter(([, v]) => v).map(([k, v]) => [k, ms(v.p50), ms(v.p90), ms(v.p99), ms(v.mean), ms(v.max),
        v.band ? `${ms(v.mean * (1 + v.band.lower))} to ${ms(v.mean * (1 + v.band.upper))}` : "unknown"]), [1, 2, 3, 4, 5]));
  const band = [sim.ttft_s, sim.tpot_s, sim.e2e_s].map((v) => v && v.band).find((b) => b);
  out.push(h("p", { class: "help" }, band
    ? `True mean likely: where the real means of ${int(band.runs)} held-out runs on the ${band.basis} basis (${band.gpus.length} GPUs) lay against their simulations; sized without their ${band.leave_one_out ? band.leave_one_out.by : "GPU"}, the bands held ` +
      [["TTFT", sim.ttft_s], ["TPOT", sim.tpot_s], ["end to end", sim.e2e_s]].filter(([, v]) => v && v.band && v.band.leave_one_out)
        .map(([n, v]) => `${n} ${int(v.band.leave_one_out.inside)} of ${int(v.band.leave_one_out.runs)}`).join(", ") + " runs (the accuracy page says more)."
    : "True mean likely: unknown (no held-out runs judge these times: a calibration, the roofline, or an engine they were not served by)."));
  const tl = sim.timeline;
  if (tl.length > 1) {
    const t1 = tl[tl.length - 1].time;
    out.push(h("h3", {}, "KV cache usage over time"), h("figure", {}, lineChart({ title: "KV cache usage over time", xs: [0, t1], xLog: false,
      xLabel: "simulated time (s)", yMax: 1, yLabel: "usage", yFormat: (v) => `${Math.round(v * 100)}%`,
      series: [{ name: "usage", color: COLORS[0], points: tl.map((x) => [x.time, x.usage]) }], height: 240 })));
    const qMax = Math.max(1, ...tl.map((x) => Math.max(x.running, x.waiting))) * 1.05;
    out.push(h("h3", {}, "Queues over time"), h("figure", {}, lineChart({ title: "Running and waiting requests over time", xs: [0, t1], xLog: false,
      xLabel: "simulated time (s)", yMax: qMax, yLabel: "requests", yFormat: (v) => int(v), yWhole: true,
      series: [{ name: "running", color: COLORS[2], points: tl.map((x) => [x.time, x.running]) },
        { name: "waiting", color: COLORS[1], dash: DASHES[1], points: tl.map((x) => [x.time, x.waiting]) }], height: 240 }),
    legend([{ color: COLORS[2], label: "running" }, { color: COLORS[1], dash: DASHES[1], label: "waiting" }])));
  }
  const lt = (sim.latency_timeline || []).filter((w) => w.ttft_s);
  if (lt.length > 1) {
    const mid = (w) => (w.start + w.end) / 2;
    out.push(h("h3", {}, "Latency over time ", badge("estimate", `times: ${st.time_model.basis || "estimated"}`)));
    for (const [key, what, color] of [["ttft_s", "time to first token", COLORS[0]], ["e2e_s", "end to end", COLORS[3]]]) {
      out.push(h("figure", {}, lineChart({ title: `${what}: p50 and p99 of the requests completing in each window`,
        xs: [0, sim.duration_s], xLog: false, xLabel: "simulated time (s)", yMax: Math.max(...lt.map((w) => w[key].p99)) * 1.05 || 1,
        yLabel: `${what} (s)`, yFormat: (v) => `${+v.toFixed(2)}`, height: 200,
        series: [{ name: `${key.split("_")[0]}-p50`, color, points: lt.map((w) => [mid(w), w[key].p50]) },
          { name: `${key.split("_")[0]}-p99`, color, dash: DASHES[1], points: lt.map((w) => [mid(w), w[key].p99]) }] }),
      legend([{ color, label: `${what} p50` }, { color, dash: DASHES[1], label: "p99" }])));
    }
    out.push(h("p", { class: "help" }, `Each point: the requests completing in one ${fixed(lt[0].end - lt[0].start, 1)} s window.`));
  }
  if (sim.guard) {
    const g = sim.guard, f = g.forwarded;
    out.push(h("h3", {}, "Guard decisions"), table(["decision", "requests"], [
      ["forwarded untouched", int(f["0"] || 0)], ["forwarded with max_tokens capped (level 1)", int(f["1"] || 0)],
      ["forwarded as one sample, no beams (level 2)", int(f["2"] || 0)], ["rejected with 503 (level 3)", int(g.rejected)],
      ["output tokens cut by the caps", int(g.tokens_cut)], ["peak predicted usage", pct(g.peak_predicted)]], [1]));
  }
  out.push(notes(sim.notes));
  if (credit) out.push(h("p", { class: "help" }, `Trace: ${credit}.`));
  view.replaceChildren(...out);
}

// A fleet's answer (replicas behind a router): the whole run, each replica, and each one's KV usage and queue.
const FLEET_LINES = 16;  // replicas drawn one line each; the table lists every one
function fleetView(sim, credit) {
  const f = sim.fleet, reps = f.replicas, st = f.pools[0].setup, pool = f.pools[0];
  const basis = st.time_model.basis || "estimated";
  const shape = st.expert_group ? `an expert-parallel group of ${reps.length} data-parallel ranks stepping together (vLLM's own balancer)`
    : `${reps.length} replicas behind the ${f.router} router`;
  const out = [h("h2", {}, `${st.model} on ${st.engine}, ${st.gpu || "no GPU named"}: ${shape}`)];
  out.push(h("p", {}, (st.allocator === "paged" ? `each ${int(st.num_blocks)} blocks of ${st.block_size} tokens`
    : `each: ${st.allocator} allocator`) + `; max_num_seqs ${st.max_num_seqs}, max_num_batched_tokens ${int(st.max_num_batched_tokens)}, prefix caching ${st.prefix_caching ? "on" : "off"}`));
  out.push(h("div", { class: "summary" },
    card("Requests", `${int(sim.completed)} of ${int(sim.requests)}`, "", "completed"),
    card("Simulated time", `${fixed(sim.duration_s, 1)} s`, "", "duration"),
    card("Throughput", `${fixed(sim.requests_per_s, 2)} req/s`, badge("estimate", `times: ${basis}`), "requests_per_s"),
    card("Peak KV usage", pct(pool.peak_usage), badge("exact", "the allocator's blocks; the highest replica's"), "peak_usage"),
    card("Preemptions", int(sim.preemptions), "", "preemptions"),
    card("Replicas", int(reps.length), "", "replicas")));
  out.push(h("h3", {}, "Latency over the fleet ", badge("estimate", `times: ${basis}`)),
    table(["", "p50", "p90", "p99", "mean", "max"], [["time to first token", sim.ttft_s], ["time per output token", sim.tpot_s], ["end to end", sim.e2e_s]]
      .filter(([, v]) => v).map(([k, v]) => [k, ms(v.p50), ms(v.p90), ms(v.p99), ms(v.mean), ms(v.max)]), [1, 2, 3, 4, 5]));
  const short = (v) => v < 1 ? `${Math.round(v * 1000)} ms` : `${v.toFixed(1)} s`;
  const p50p99 = (v) => v ? `${short(v.p50)} / ${short(v.p99)}` : "–";
  out.push(h("h3", {}, "Per replica"), h("div", { "data-value": "replicas-table" }, table(
    ["replica", "routed", "done", "TTFT p50 / p99", "TPOT p50 / p99", "E2E p50 / p99", "KV peak / mean", "preempted", "prefix hits"],
    reps.map((r) => [String(r.index), int(r.routed), int(r.completed), p50p99(r.ttft_s), p50p99(r.tpot_s), p50p99(r.e2e_s),
      `${Math.round(r.peak_usage * 100)}% / ${Math.round(r.mean_usage * 100)}%`, int(r.preemptions), r.prefix_hit_rate == null ? "–" : pct(r.prefix_hit_rate)]),
    [1, 2, 3, 4, 5, 6, 7, 8])));
  const drawn = reps.slice(0, FLEET_LINES).filter((r) => r.timeline.length > 1);
  if (drawn.length) {
    const t1 = sim.duration_s || 1;
    const line = (r, i, key) => ({ name: `${key}-${r.index}`, color: COLORS[i % COLORS.length], dash: DASHES[Math.floor(i / COLORS.length) % DASHES.length],
      width: 1.5, points: r.timeline.map((x) => [x.time, x[key]]) });
    const keys = legend(drawn.map((r, i) => ({ color: COLORS[i % COLORS.length], dash: DASHES[Math.floor(i / COLORS.length) % DASHES.length], label: `replica ${r.index}` })));
    const more = reps.length > FLEET_LINES ? h("p", { class: "help" }, `The first ${FLEET_LINES} of ${reps.length} replicas drawn; the table lists every one.`) : null;
    out.push(h("h3", {}, "KV cache usage per replica"), h("figure", {}, lineChart({ title: "KV cache usage per replica over time", xs: [0, t1], xLog: false,
      xLabel: "simulated time (s)", yMax: 1, yLabel: "usage", yFormat: (v) => `${Math.round(v * 100)}%`, height: 240,
      series: drawn.map((r, i) => line(r, i, "usage")) }), keys));
    if (more) out.push(more);
    const qMax = Math.max(1, ...drawn.flatMap((r) => r.timeline.map((x) => x.waiting))) * 1.05;
    out.push(h("h3", {}, "Waiting requests per replica"), h("figure", {}, lineChart({ title: "Waiting requests per replica over time", xs: [0, t1], xLog: false,
      xLabel: "simulated time (s)", yMax: qMax, yLabel: "waiting", yFormat: (v) => int(v), yWhole: true, height: 240,
      series: drawn.map((r, i) => line(r, i, "waiting")) }), keys.cloneNode(true)));
  }
  if (credit) out.push(h("p", { class: "help" }, `Trace: ${credit}.`));
  return out;
}

// ---- the recommend view: the search, its answer and the chosen deployment's files ----------------------------
const REC_KEYS = ["engine", "max_model_len", "rate", "requests", "rate_scale", "slice", "router"];
function recommendParams() {
  const p = params(REC_KEYS, { trace: state.rate ? "" : state.trace });
  for (const o of SEARCH) if (state[REC + o.name]) p.set(o.name, state[REC + o.name]);
  return p;
}
function searchForm(options, limits) {
  SEARCH = options;
  $("search-fields").replaceChildren(...options.map((o) => {
    const id = REC + o.name, label = o.name.replace(/_/g, " ");
    const described = `${id}-help ${id}-error`;
    const control = o.switch ? h("input", { id, name: id, type: "checkbox", value: "1", "aria-describedby": described })
      : o.choices ? h("select", { id, name: id, "aria-describedby": described }, h("option", { value: "" }, `${o.default} (the default)`),
        o.choices.filter((c) => c !== o.default).map((c) => h("option", { value: c }, c)))
        : h("input", { id, name: id, autocomplete: "off", spellcheck: "false", placeholder: o.default || "",
          "aria-describedby": described, "aria-required": o.required ? "true" : null });
    return h("div", { class: o.switch ? "field check" : "field", "data-field": id }, ...(o.switch ? [control, h("label", { for: id }, label)]
      : [h("label", { for: id }, label + (o.required ? " (required)" : "")), control]),
    h("p", { class: "help", id: `${id}-help` }, o.help), h("p", { class: "error", id: `${id}-error`, role: "alert", hidden: true }));
  }));
  $("search-help").textContent = `On this page: at most ${int(limits.recommend_candidates)} candidates, ${int(limits.recommend_max_gpus)} GPUs each, ` +
    `${int(limits.recommend_requests)} requests and ${limits.recommend_seconds} s per search, one search at a time; kvbudget recommend searches further.`;
}
const objectives = (r) => Object.keys(r.slo_s);
function latency(r, t) {  // each objective's value with the simulator's error band of means around it
  return objectives(r).map((k) => {
    const v = t.values_s[k], b = t.bands_s[k];
    return v == null ? "–" : `${ms(v)}${b ? ` (${ms(b[0])} to ${ms(b[1])})` : ""}`;
  });
}
const dollars = (v, d = 2) => v == null ? "–" : `$${fixed(v, d)}`;
async function renderRecommend(gen, run) {
  const view = $("view-recommend");
  if (!run) {
    if (!view.childElementCount) view.append(h("p", { class: "help" }, "Give the objectives and the traffic (left), then search."));
    else if (!view.querySelector(".stale")) view.prepend(h("p", { class: "stale error" }, "The settings changed: search again."));
    return;
  }
  const p = recommendParams();
  busy(`Searching (up to ${choices ? choices.limits.recommend_seconds : 60} s)…`);
  const r = await api("recommend", p);
  if (gen !== generation) return;
  const c = r.candidates, goals = objectives(r).map((k) => `${k} ≤ ${ms(r.slo_s[k])}`).join(", ");
  const out = [h("h2", {}, `${r.model} on ${r.engine}: ${goals}`),
    h("p", {}, `${int(c.listed)} candidates: ${int(c.pruned)} pruned (the engine would not start them, or they cannot be simulated), ` +
      `${int(c.simulated)} simulated, ${int(c.skipped)} not simulated (they cost more per hour than one that met the objectives).`)];
  const best = r.best;
  if (best) {
    out.push(h("h3", { id: "chosen" }, "Cheapest meeting the objectives: ", h("span", { "data-value": "best" }, best.label)),
      h("div", { class: "summary" },
        card("GPUs", int(best.candidate.gpus), "", "gpus"),
        card("Price", `${dollars(best.price_per_hour)}/hour`, "", "price"),
        card("Per million tokens", dollars(best.cost.per_million_tokens, 3), badge("estimate", "simulated times"), "per_million_tokens"),
        card("Tokens/s per GPU", int(best.tokens_per_s_per_gpu), badge("estimate", "simulated times"), "tokens_per_s_per_gpu")),
      table(["objective", "limit", "simulated (error band of means)"], objectives(r).map((k, i) => [k, ms(r.slo_s[k]), latency(r, best)[i]]), [1, 2]));
  } else {
    out.push(h("p", { class: "error top", id: "binding", role: "alert" }, `No candidate meets the objectives: ${r.binding}`));
  }
  out.push(h("p", { class: "help" }, "The range around each figure: where the true mean lay against the simulation in the held-out runs of the accuracy page (they judge means; a tail percentile's error may be wider)."));
  for (const q of r.quality_checks) out.push(h("p", { class: "note quality" }, `Note: ${q}`));
  if (r.front.length) {
    out.push(h("h3", {}, "Pareto front ", badge("estimate", "simulated times")),
      table(["candidate", "GPUs", "tokens/s per GPU", ...objectives(r), "$ per M tokens", "met"],
        r.front.map((t) => [t.label, int(t.candidate.gpus), int(t.tokens_per_s_per_gpu), ...latency(r, t),
          dollars(t.cost.per_million_tokens, 3), best && t.label === best.label ? "chosen" : t.met ? "yes" : "no"]),
        [1, 2, ...objectives(r).map((_, i) => 3 + i), 3 + objectives(r).length]));
  }
  if (r.runners_up.length) {
    const shown = r.runners_up.slice(0, RUNNERS_UP);
    out.push(h("h3", {}, `Runners-up, cheapest first (${shown.length} of ${r.runners_up.length})`),
      table(["candidate", "$/hour", "why it lost"], shown.map((t) => [t.label, fixed(t.price_per_hour, 2), t.why]), [1]));
  }
  if (r.pruned.length) out.push(h("h3", {}, "Pruned"), h("ul", { class: "notes" },
    r.pruned.map((x) => h("li", {}, `${x.setting} (${int(x.candidates)} candidate${x.candidates > 1 ? "s" : ""}): ${x.reason}`))));
  if (r.files_error) out.push(h("p", { class: "error" }, `No files: ${r.files_error}`));
  if (r.files.length) {
    out.push(h("h3", {}, "The chosen deployment's files"),
      h("p", {}, h("a", { id: "download-files", class: "button", href: `/api/recommend.zip?${p}`, download: "deployment.zip" },
        `Download all ${r.files.length} files (zip)`), " (what kvbudget recommend --out DIR writes)"),
      ...r.files.map((f) => h("details", { class: "file" }, h("summary", {}, h("code", {}, f.name), `: ${f.what}; ${f.apply}.`),
        h("pre", {}, f.text))));
  }
  view.replaceChildren(...out);
}
const RUNNERS_UP = 20;  // runners-up the table shows (the JSON: all)

// ---- the quality view ----------------------------------------------------------------------------------------
async function renderQuality(gen) {
  const view = $("view-quality");
  if (!state.report) { view.replaceChildren(h("p", { class: "help" }, "Upload a report written by kvbudget quality --json (left).")); return; }
  const r = await api("quality", new URLSearchParams({ report: state.report }));
  if (gen !== generation) return;
  const mem = r.results.some((x) => x.memory);
  view.replaceChildren(h("h2", {}, `${r.model}: KV cache formats against the untouched cache`),
    h("p", {}, `${r.results[0].windows} windows of ${int(r.context)} tokens (${int(r.results[0].tokens)} scored)`),
    h("figure", {}, barChart(r.results.map((x) => [x.variant, x.kl_mean]), (v) => v.toPrecision(2)),
      h("figcaption", {}, "Mean KL divergence of the next-token distribution (nats) per cache format.")),
    table(["format", "KL mean", "top-1 agreement", "perplexity", ...(mem ? ["bytes/token", "tokens vs default"] : [])],
      r.results.map((x) => [x.variant, x.kl_mean.toPrecision(2), pct(x.top1_agreement), `${x.perplexity_change >= 0 ? "+" : ""}${pct(x.perplexity_change)}`,
        ...(mem ? [x.memory && x.memory.bytes_per_token ? int(x.memory.bytes_per_token) : "–", x.memory && x.memory.gain ? times(x.memory.gain) : "–"] : [])]), [1, 2, 3, 4, 5]),
    h("p", {}, h("strong", {}, r.verdict)), notes(r.notes));
}
// ---- uploads -------------------------------------------------------------------------------------------------
async function upload(kind, file, field) {
  clearErrors();
  const cap = choices ? (kind === "trace" ? choices.limits.trace_bytes : kind === "report" ? choices.limits.report_bytes
    : file.name.toLowerCase().endsWith(".gguf") ? choices.limits.gguf_header_bytes : choices.limits.config_bytes) : Infinity;
  const gguf = file.name.toLowerCase().endsWith(".gguf");
  const body = gguf ? file.slice(0, Math.min(file.size, cap)) : file;  // a GGUF: its header only
  busy(`uploading ${file.name}…`);
  try {
    const r = await fetch(`/api/upload?${new URLSearchParams({ kind, name: file.name })}`, {
      method: "POST", body, headers: gguf ? { "X-File-Size": String(file.size) } : {} });
    const answer = await r.json().catch(() => ({ error: `the server answered ${r.status}` }));
    if (!r.ok) throw Object.assign(new Error(answer.error), { body: { ...answer, field: answer.field || field } });
    return answer;
  } catch (err) { showError(err); busy(""); return null; }
}

// ---- the view and its updates --------------------------------------------------------------------------------
function showView() {
  for (const v of VIEWS) {
    const tab = $(`tab-${v}`);
    tab.setAttribute("aria-selected", String(v === state.view));
    tab.tabIndex = v === state.view ? 0 : -1;
    $(`view-${v}`).hidden = v !== state.view;
  }
  for (const e of document.querySelectorAll("[data-views]")) e.hidden = !e.dataset.views.split(" ").includes(state.view);
}
let timer = null;
function update(run = false) {
  clearTimeout(timer);
  timer = setTimeout(() => refresh(run), run ? 0 : 250);
}
async function refresh(run) {
  writeURL();
  const gen = ++generation;
  clearErrors();
  busy("computing…");
  try {
    if (state.view === "plan") await renderPlan(gen);
    else if (state.view === "compare") await renderCompare(gen);
    else if (state.view === "simulate") await renderSimulate(gen, run);
    else if (state.view === "recommend") await renderRecommend(gen, run);
    else await renderQuality(gen);
  } catch (err) {
    if (gen === generation) showError(err);
  }
  if (gen === generation) busy("");
}

function syncSlider() {
  const v = parseContext(state.max_model_len);
  $("context-slider").value = v ? Math.log2(v) : $("context-slider").max;
}
function parseContext(text) {
  const m = /^\s*([\d.]+)\s*([kKmM]?)\s*$/.exec(text || "");
  if (!m) return null;
  return Math.round(parseFloat(m[1]) * (m[2].toLowerCase() === "k" ? 1024 : m[2].toLowerCase() === "m" ? 2 ** 20 : 1));
}

async function start() {
  readURL();
  try { choices = await api("choices"); } catch (err) { showError(err); return; }
  CHART_ENGINES = choices.chart_engines;
  $("model-list").replaceChildren(...choices.models.map((m) => h("option", { value: m.name }, m.hf_id)));
  $("engine").replaceChildren(...choices.engines.map((e) => h("option", { value: e }, e)));
  if (state.engine && !choices.engines.includes(state.engine)) $("engine").append(h("option", { value: state.engine }, state.engine));  // a release from a link: ?engine=vllm@0.10
  $("kv_dtype").replaceChildren(...choices.kv_dtypes.map((d) => h("option", { value: d }, d)));
  $("gpu").replaceChildren(h("option", { value: "" }, "(none: give memory)"),
    ...choices.gpus.map((g) => h("option", { value: g.name }, `${g.name} (${fmtBytes(g.memory_bytes)})`)));
  $("trace").replaceChildren(...choices.traces.map((t) => h("option", { value: t.name }, t.what)));
  if (state.trace && state.trace.startsWith("upload:")) $("trace").append(h("option", { value: state.trace }, `uploaded (${state.trace.slice(7, 20)}…)`));
  searchForm(choices.recommend, choices.limits);
  toControls();
  for (const e of document.querySelectorAll("#controls input:not([type=file]), #controls select")) {
    if (e.id === "context-slider") continue;
    e.addEventListener(e.tagName === "SELECT" || e.type === "checkbox" ? "change" : "input", () => {
      fromControl(e); if (e.id === "max_model_len") syncSlider(); update(); });
  }
  $("context-slider").addEventListener("input", (ev) => {
    const v = Math.round(2 ** parseFloat(ev.target.value));
    state.max_model_len = String(v); $("max_model_len").value = state.max_model_len; update();
  });
  const tabs = VIEWS.map((v) => $(`tab-${v}`));
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => { state.view = tab.dataset.view; showView(); update(); });
    tab.addEventListener("keydown", (ev) => {
      const j = ev.key === "ArrowRight" ? (i + 1) % tabs.length : ev.key === "ArrowLeft" ? (i + tabs.length - 1) % tabs.length : -1;
      if (j >= 0) { ev.preventDefault(); tabs[j].focus(); tabs[j].click(); }
    });
  });
  $("run-simulation").addEventListener("click", () => update(true));
  $("run-recommend").addEventListener("click", () => update(true));
  $("model-file").addEventListener("change", async (ev) => {
    const f = ev.target.files[0]; if (!f) return;
    const answer = await upload("model", f, "model");
    if (answer) { state.model = answer.id; $("model").value = answer.id; update(); }
  });
  $("trace-file").addEventListener("change", async (ev) => {
    const f = ev.target.files[0]; if (!f) return;
    const answer = await upload("trace", f, "trace");
    if (answer) {
      $("trace").append(h("option", { value: answer.id }, `${f.name} (${int(answer.requests)} requests)`));
      state.trace = answer.id; state.rate = ""; toControls(); busy("");
    }
  });
  $("report-file").addEventListener("change", async (ev) => {
    const f = ev.target.files[0]; if (!f) return;
    const answer = await upload("report", f, "report");
    if (answer) { state.report = answer.id; update(); }
  });
  $("copy-link").addEventListener("click", async () => {
    writeURL();
    try { await navigator.clipboard.writeText(location.href); $("copied").textContent = "link copied"; }
    catch { $("copied").textContent = location.href; }
  });
  update(state.view === "simulate" || state.view === "recommend");
}
document.addEventListener("DOMContentLoaded", start);
