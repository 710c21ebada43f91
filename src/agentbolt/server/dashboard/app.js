// agentbolt dashboard: one ES module, no build step. Hash routes (every view has a URL you can paste):
//   #/rollouts?status=failed&q=...      #/rollouts/ID      #/rollouts/ID/trace?attempt=AT&span=SP
//   #/rollouts/ID/tokens?attempt=AT&t=2  #/resources?a=rs-1&b=rs-2  #/runners  #/errors  #/training
//   #/run?run=rs-1 (default: the latest run)
// Auth: the server may want "Authorization: Bearer <token>" on /v1 (agentbolt serve --token). The token is asked for
// once, kept in sessionStorage, also taken from "#token=..."; a 401 shows the token box again.
// Data is put into the page with textContent / DOM nodes only (never innerHTML), so stored text cannot inject markup.

const TOKEN_KEY = "agentbolt.token";
const PAGE_SIZE = 50;
const ROLLOUT_STATUSES = ["queuing", "preparing", "running", "requeuing", "succeeded", "failed", "cancelled"];
const MODES = ["train", "val", "test"];
const SORT_FIELDS = { rollout_id: "Rollout", status: "Status", final_reward: "Reward", enqueue_time: "Enqueued",
  start_time: "Started", end_time: "Ended" };
const REFRESH_MS = 5000;

// ---------------------------------------------------------------------------------------------- DOM helpers

/** h("div.cls#id", {attr: v, onclick: fn}, child, ...): a DOM element; strings become text nodes. */
function h(spec, attrs, ...children) {
  const [, tag, rest] = spec.match(/^([a-z0-9]+)?(.*)$/i);
  const el = document.createElement(tag || "div");
  for (const part of rest.match(/[.#][^.#]+/g) || []) {
    if (part[0] === ".") el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  if (attrs !== undefined && attrs !== null && (typeof attrs !== "object" || attrs instanceof Node ||
    Array.isArray(attrs))) { // a first child, 0 and "" included
    children.unshift(attrs);
    attrs = null;
  }
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const main = () => document.getElementById("main");

function fmtTime(t) {
  if (t === null || t === undefined) return "";
  const d = new Date(t * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:` +
    `${pad(d.getSeconds())}`;
}

function fmtDuration(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 2 : 0)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  return `${(s / 60).toFixed(1)} min`;
}

function fmtAgo(t) {
  const s = Date.now() / 1000 - t;
  return s < 0 ? "just now" : `${fmtDuration(s)} ago`;
}

function fmtNum(x, digits = 4) {
  if (x === null || x === undefined) return "";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return x !== 0 && Math.abs(x) < 10 ** -(digits - 1) ? String(Number(x.toPrecision(3))) : x.toFixed(digits);
}

function badge(status) {
  return h(`span.badge.${status}`, status);
}

function json(value, indent = 2) {
  return JSON.stringify(value, null, indent);
}

function kvTable(rows) {
  return h("table.kv", h("tbody", rows.map(([k, v]) => h("tr", h("th", k), h("td", v)))));
}

function table(headers, rows, attrs) {
  return h("table", attrs || {}, h("thead", h("tr", headers.map((x) => (x instanceof Node ? x : h("th", x))))),
    h("tbody", rows));
}

function message(text, cls = "muted") {
  return h(`p.${cls}`, text);
}

// ---------------------------------------------------------------------------------------------- auth + fetch

class AuthError extends Error {}

class NotFoundError extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showAuth(text) {
  const form = document.getElementById("auth");
  document.getElementById("auth-message").textContent = text;
  form.hidden = false;
  document.getElementById("auth-token").focus();
}

/** GET a /v1 path as JSON with the bearer token; 401 shows the token box, other errors throw the server's message. */
async function api(path) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const resp = await fetch(path, { headers });
  if (resp.status === 401) {
    showAuth(token()
      ? "The server refused this token (401). Enter the token the server was started with (agentbolt serve --token)."
      : "This server needs a bearer token (401). Enter the token it was started with (agentbolt serve --token).");
    throw new AuthError("unauthorized");
  }
  if (!resp.ok) {
    let text = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      const detail = body?.error?.message ?? body?.detail;
      if (detail) text += `: ${typeof detail === "string" ? detail : json(detail, 0)}`;
    } catch { /* not JSON */ }
    throw resp.status === 404 ? new NotFoundError(text) : new Error(text);
  }
  return resp.json();
}

/** The same GET at most once per page view (re-rendering for ?span= or ?t= does not fetch again). */
const memo = new Map();
function cached(path) {
  if (!memo.has(path)) memo.set(path, api(path).catch((err) => { memo.delete(path); throw err; }));
  return memo.get(path);
}

/** An optional endpoint (the server may be older): null when it answers 404. */
async function optional(path) {
  try {
    return await cached(path);
  } catch (err) {
    if (err instanceof NotFoundError) return null;
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------- routing

function decodePart(part) {
  try { return decodeURIComponent(part); } catch { return part; } // a malformed %-escape in a pasted URL
}

function parseRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodePart), params: new URLSearchParams(query) };
}

function href(parts, params) {
  const path = parts.map(encodeURIComponent).join("/");
  const entries = Object.entries(params || {}).filter(([, v]) => v !== undefined && v !== null && v !== "");
  const query = new URLSearchParams(entries).toString();
  return `#/${path}${query ? `?${query}` : ""}`;
}

let renderSerial = 0;
let pageKey = "";
let timer = null;

async function render() {
  const serial = ++renderSerial;
  if (timer) { clearInterval(timer); timer = null; }
  const { parts, params } = parseRoute();
  const key = parts.join("/");
  if (key !== pageKey) { memo.clear(); pageKey = key; }
  const page = parts[0] || "rollouts";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  const view = {
    rollouts: parts.length === 1 ? rolloutsPage : parts[2] === "trace" ? tracePage : parts[2] === "tokens" ? tokensPage
      : rolloutPage,
    resources: resourcesPage, runners: runnersPage, errors: errorsPage, training: trainingPage, run: runPage,
  }[page];
  const target = h("div");
  try {
    if (!view) throw new NotFoundError(`no page ${page}`);
    await view(target, parts, params, () => serial === renderSerial);
    if (serial !== renderSerial) return;
    document.getElementById("auth").hidden = true;
  } catch (err) {
    if (serial !== renderSerial) return;
    if (err instanceof AuthError) target.replaceChildren(message("Waiting for the token..."));
    else target.replaceChildren(h("p.error", `Could not load this page: ${err.message}`));
  }
  main().replaceChildren(target);
  document.title = `agentbolt: ${page}`;
}

function navigate(parts, params) {
  location.hash = href(parts, params);
}

// ---------------------------------------------------------------------------------------------- rollouts

async function rolloutsPage(root, parts, params) {
  const offset = Number(params.get("offset") || 0);
  const sortBy = params.get("sort_by") || "enqueue_time";
  const descending = (params.get("descending") ?? "true") === "true";
  const filters = {};
  for (const k of ["status", "mode", "resources_id", "reward_min", "reward_max", "q"]) {
    if (params.get(k)) filters[k] = params.get(k);
  }
  const query = new URLSearchParams({ ...filters, sort_by: sortBy, descending: String(descending),
    limit: String(PAGE_SIZE), offset: String(offset) });
  // a bad filter in a pasted URL (reward_min=abc, offset=-5...) answers 422: show it under the form, to fix there
  const [page, versions] = await Promise.all([
    api(`/v1/rollouts/search?${query}`).catch((err) => (err instanceof AuthError ? Promise.reject(err) : err)),
    cached("/v1/resources"),
  ]);
  const state = { ...filters, sort_by: sortBy, descending: String(descending) };
  const go = (changes) => navigate(["rollouts"], { ...state, offset: 0, ...changes });

  // filter form
  const chosen = new Set((filters.status || "").split(",").filter(Boolean));
  const statusBoxes = ROLLOUT_STATUSES.map((s) => h("label.check",
    h("input", { type: "checkbox", name: "status", value: s, checked: chosen.has(s) }), ` ${s}`));
  const select = (name, options, current) => h("select", { name },
    h("option", { value: "" }, "any"), options.map((o) => h("option", { value: o, selected: o === current }, o)));
  const form = h("form.filters", {
    onsubmit: (ev) => {
      ev.preventDefault();
      const data = new FormData(ev.target);
      go({ status: data.getAll("status").join(","), mode: data.get("mode"), resources_id: data.get("resources_id"),
        reward_min: data.get("reward_min"), reward_max: data.get("reward_max"), q: data.get("q").trim() });
    },
  },
  h("label", "Status", h("fieldset", statusBoxes)),
  h("label", "Mode", select("mode", MODES, filters.mode)),
  h("label", "Resources", select("resources_id", versions.map((v) => v.resources_id), filters.resources_id)),
  h("label", "Reward min", h("input", { type: "number", step: "any", name: "reward_min", value: filters.reward_min })),
  h("label", "Reward max", h("input", { type: "number", step: "any", name: "reward_max", value: filters.reward_max })),
  h("label", "Search input", h("input", { type: "search", name: "q", value: filters.q, placeholder: "text in input" })),
  h("button", { type: "submit" }, "Apply"),
  h("button", { type: "button", onclick: () => navigate(["rollouts"], {}) }, "Clear"));

  if (page instanceof Error) {
    append(root, [h("h1", "Rollouts"), form, h("p.error#search-error", `Could not search: ${page.message}`)]);
    return;
  }

  const header = Object.entries(SORT_FIELDS).map(([field, label]) => {
    const th = h(`th.sortable${field === "final_reward" ? ".num" : ""}`, {
      onclick: () => go({ sort_by: field, descending: String(field === sortBy ? !descending : true) }),
      title: `sort by ${field}`,
    }, label);
    if (field === sortBy) th.classList.add("sorted", ...(descending ? ["desc"] : []));
    return th;
  });
  const headers = [header[0], header[1], h("th", "Mode"), h("th", "Resources"), h("th", "Input"), header[2],
    h("th.num", "Attempts"), header[3], h("th", "Duration")];
  const rows = page.items.map((r) => h("tr", { "data-rollout": r.rollout_id },
    h("td", h("a.mono", { href: href(["rollouts", r.rollout_id]) }, r.rollout_id)),
    h("td", badge(r.status)),
    h("td", r.mode),
    h("td", r.resources_id || h("span.muted", "latest")),
    h("td.input", { title: json(r.input) }, json(r.input, 0)),
    h("td.num", fmtNum(r.final_reward)),
    h("td.num", r.num_attempts),
    h("td", fmtTime(r.enqueue_time)),
    h("td", r.start_time && r.end_time ? fmtDuration(r.end_time - r.start_time) : "")));
  const last = Math.min(offset + page.items.length, page.total);
  const lastPage = Math.max(0, Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
  const beyond = !page.items.length && offset > 0 && page.total > 0; // a pasted offset past the end
  const count = page.total === 0 ? "0 rollouts" : beyond ? `none at ${offset + 1} of ${page.total} rollouts`
    : `${offset + 1}\u2013${last} of ${page.total} rollouts`;
  const pager = h("div.pager",
    h("button", { disabled: offset <= 0, onclick: () => go({ offset: beyond ? lastPage
      : Math.max(0, offset - PAGE_SIZE) }) }, "Previous"),
    h("span#rollout-count", count),
    h("button", { disabled: last >= page.total || beyond, onclick: () => go({ offset: offset + PAGE_SIZE }) }, "Next"));
  append(root, [h("h1", "Rollouts"), form, pager,
    page.items.length ? table(headers, rows, { id: "rollouts-table" })
      : beyond ? h("p.muted", "No rollout on this page. ", h("a", { href: href(["rollouts"], { ...state,
        offset: lastPage }) }, "Last page"))
        : message("No rollout matches these filters.")]);
}

// ---------------------------------------------------------------------------------------------- one rollout

function rolloutTabs(rolloutId, active, attemptId) {
  const tab = (name, label) => h(`a${active === name ? ".active" : ""}`,
    { href: href(["rollouts", rolloutId, ...(name ? [name] : [])], name ? { attempt: attemptId } : {}) }, label);
  return [h("div.crumbs", h("a", { href: "#/rollouts" }, "Rollouts"), " / ", h("span.mono", rolloutId)),
    h("div.tabs", tab("", "Overview"), tab("trace", "Trace"), tab("tokens", "Tokens"))];
}

async function rolloutPage(root, parts) {
  const id = parts[1];
  const [r, attempts] = await Promise.all([cached(`/v1/rollouts/${encodeURIComponent(id)}`),
    cached(`/v1/rollouts/${encodeURIComponent(id)}/attempts`)]);
  const latest = attempts.at(-1);
  const rows = attempts.map((a) => h("tr", { "data-attempt": a.attempt_id },
    h("td.num", a.sequence_id), h("td.mono", a.attempt_id), h("td", badge(a.status)), h("td.mono", a.worker_id || ""),
    h("td", a.resources_id || ""), h("td", fmtTime(a.start_time)), h("td", fmtTime(a.end_time)),
    h("td", a.end_time ? fmtDuration(a.end_time - a.start_time) : ""),
    h("td", a.last_heartbeat_time ? fmtTime(a.last_heartbeat_time) : ""),
    h("td", a.error ? h("details.attempt-error", h("summary.error", `${a.error.type}: ${a.error.message}`),
      a.error.traceback ? h("pre", a.error.traceback) : null) : ""),
    h("td", h("a", { href: href(["rollouts", id, "trace"], { attempt: a.attempt_id }) }, "trace"), " ",
      h("a", { href: href(["rollouts", id, "tokens"], { attempt: a.attempt_id }) }, "tokens"))));
  append(root, [
    rolloutTabs(id, "", latest?.attempt_id),
    h("h1", "Rollout ", h("span.mono", id), " ", badge(r.status)),
    kvTable([
      ["mode", r.mode], ["resources", r.resources_id || "latest at claim time"],
      ["final reward", r.final_reward === null ? h("span.muted", "none") : fmtNum(r.final_reward)],
      ["attempts", `${r.num_attempts} of at most ${r.config.max_attempts}`],
      ["enqueued", fmtTime(r.enqueue_time)], ["started", fmtTime(r.start_time)], ["ended", fmtTime(r.end_time)],
      ["duration", r.start_time && r.end_time ? fmtDuration(r.end_time - r.start_time) : ""],
      ["metadata", h("pre", json(r.metadata))], ["config", h("pre", json(r.config))],
    ]),
    h("h2", "Input"), h("pre#rollout-input", json(r.input)),
    h("h2", "Attempts"),
    attempts.length ? table(["#", "Attempt", "Status", "Worker", "Resources", "Started", "Ended", "Duration",
      "Last heartbeat", "Error", ""], rows, { id: "attempts-table" }) : message("Not claimed yet."),
  ]);
}

// ---------------------------------------------------------------------------------------------- trace

const KIND_LABEL = { llm: "LLM", tool: "TOOL", reward: "REWARD", exception: "EXC", agent: "AGENT", other: "SPAN" };

function maybeJson(value) {
  if (typeof value !== "string") return value;
  try { return JSON.parse(value); } catch { return value; }
}

/** The kind of a span, by agentbolt's names and the OpenInference / OTel GenAI conventions. */
function spanKind(span) {
  const a = span.attributes || {};
  const oi = String(a["openinference.span.kind"] || "").toUpperCase();
  const op = String(a["gen_ai.operation.name"] || "");
  if (span.name === "agentbolt.exception") return "exception";
  if (span.name === "agentbolt.reward") return "reward";
  if (span.name === "agentbolt.llm_call" || oi === "LLM" || ["chat", "text_completion", "generate_content"].includes(op))
    return "llm";
  if (oi === "TOOL" || op === "execute_tool" || span.name === "agentbolt.operation") return "tool";
  if (span.name === "agentbolt.agent" || oi === "AGENT" || oi === "CHAIN" || op === "invoke_agent") return "agent";
  return "other";
}

function spanTitle(span) {
  const a = span.attributes || {};
  switch (spanKind(span)) {
    case "reward": return `reward ${a["agentbolt.reward.name"] ?? ""} = ${fmtNum(a["agentbolt.reward.value"])}`;
    case "exception": return `${a["exception.type"] || "exception"}: ${a["exception.message"] || ""}`;
    case "tool": return a["agentbolt.operation.name"] || a["tool.name"] || a["gen_ai.tool.name"] || span.name;
    case "agent": return a["agentbolt.agent.name"] || a["agent.name"] || span.name;
    case "llm": {
      const model = a["gen_ai.response.model"] || a["gen_ai.request.model"] || a["llm.model_name"] || "";
      const n = a["gen_ai.usage.output_tokens"];
      return `${span.name}${model ? ` ${model}` : ""}${n !== undefined ? ` (${n} tokens out)` : ""}`;
    }
    default: return span.name;
  }
}

/** Depth-first order of the span tree: children after their parent, siblings by store sequence. */
function spanTree(spans) {
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map();
  for (const s of spans) {
    const parent = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  const out = [];
  const walk = (parent, depth) => {
    for (const s of (children.get(parent) || []).sort((x, y) => x.sequence_id - y.sequence_id)) {
      out.push({ span: s, depth });
      walk(s.span_id, depth + 1);
    }
  };
  walk(null, 0);
  return out;
}

function attemptPicker(rolloutId, view, attempts, current) {
  if (attempts.length <= 1) return null;
  return h("p", "Attempt: ", attempts.map((a) => [h(`a${a.attempt_id === current ? ".active" : ""}`,
    { href: href(["rollouts", rolloutId, view], { attempt: a.attempt_id }) },
    `#${a.sequence_id} ${a.status}`), " "]));
}

async function chosenAttempt(rolloutId, params) {
  const attempts = await cached(`/v1/rollouts/${encodeURIComponent(rolloutId)}/attempts`);
  const wanted = params.get("attempt");
  const attempt = attempts.find((a) => a.attempt_id === wanted) || attempts.at(-1);
  return { attempts, attempt };
}

/** A note when the URL's ?attempt= is not an attempt of this rollout (the latest is shown instead). */
function unknownAttempt(params, attempt) {
  const wanted = params.get("attempt");
  return wanted && wanted !== attempt.attempt_id
    ? h("p.error#unknown-attempt", `No attempt ${wanted} in this rollout; showing the latest.`) : null;
}

async function tracePage(root, parts, params) {
  const id = parts[1];
  const { attempts, attempt } = await chosenAttempt(id, params);
  append(root, rolloutTabs(id, "trace", attempt?.attempt_id));
  if (!attempt) { root.append(message("This rollout has no attempt yet.")); return; }
  const spans = await cached(`/v1/rollouts/${encodeURIComponent(id)}/spans?attempt_id=${encodeURIComponent(
    attempt.attempt_id)}`);
  append(root, [h("h1", "Trace of ", h("span.mono", attempt.attempt_id), " ", badge(attempt.status)),
    unknownAttempt(params, attempt), attemptPicker(id, "trace", attempts, attempt.attempt_id)]);
  if (!spans.length) { root.append(message("No span was recorded for this attempt.")); return; }

  const t0 = Math.min(...spans.map((s) => s.start_time));
  const t1 = Math.max(...spans.map((s) => s.end_time ?? s.start_time));
  const total = Math.max(t1 - t0, 1e-6);
  const selectedId = params.get("span");
  const pct = (t) => `${((t - t0) / total) * 100}%`;
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => h("span", { style: { left: `${f * 100}%`,
    transform: `translateX(-${f * 100}%)` } }, fmtDuration(f * total)));
  const rows = spanTree(spans).map(({ span, depth }) => {
    const kind = spanKind(span);
    const end = span.end_time ?? span.start_time;
    const error = span.status?.code === "ERROR";
    const bar = h(`div.wf-bar.k-${kind}`, { style: { left: pct(span.start_time),
      width: `${Math.max(((end - span.start_time) / total) * 100, 0)}%` } });
    // the duration after the bar; for a bar that ends near the right edge, before it, or inside it (white) when it
    // also starts near the left edge (a dark label on the bar's color could not be read)
    const fStart = (span.start_time - t0) / total;
    const fEnd = (end - t0) / total;
    const place = fEnd < 0.8 ? ["span.wf-dur", { left: `calc(${fEnd * 100}% + 4px)` }]
      : fStart > 0.2 ? ["span.wf-dur.before", { right: `calc(${(1 - fStart) * 100}% + 4px)` }]
        : ["span.wf-dur.inside", { right: `calc(${(1 - fEnd) * 100}% + 4px)` }];
    const dur = h(place[0], { style: place[1] }, fmtDuration(end - span.start_time));
    return h(`div.wf-row${span.span_id === selectedId ? ".selected" : ""}${error ? ".span-error" : ""}`, {
      "data-span": span.span_id, "data-kind": kind, title: `${span.name} (${span.span_id})`,
      onclick: () => navigate(["rollouts", id, "trace"], { attempt: attempt.attempt_id, span: span.span_id }),
    },
    h("div.wf-name", { style: { paddingLeft: `${6 + depth * 16}px` } },
      h(`span.kind.k-${kind}`, KIND_LABEL[kind]), error ? "\u26A0 " : "", spanTitle(span)),
    h("div.wf-track", bar, dur));
  });
  const waterfall = h("div.waterfall#waterfall", h("div.wf-axis", h("div.wf-name", `${spans.length} spans`),
    h("div.wf-track.wf-ticks", ticks)), rows);
  const selected = spans.find((s) => s.span_id === selectedId);
  const legend = h("p.muted", Object.entries(KIND_LABEL).map(([k, label]) => [h(`span.kind.k-${k}`, label), " "]),
    " Click a span for its attributes.");
  root.append(h("div.split", h("div", legend, waterfall),
    selected ? spanPanel(selected, id, attempt.attempt_id) : h("div.panel", message("Select a span."))));
}

function chatMessage(m) {
  const role = m.role || "message";
  let content = m.content;
  if (Array.isArray(content)) content = content.map((c) => c.text ?? json(c)).join("\n");
  const calls = (m.tool_calls || []).map((c) => h("div.content",
    `\u2192 ${c.function?.name}(${typeof c.function?.arguments === "string" ? c.function.arguments
      : json(c.function?.arguments, 0)})`));
  return h(`div.msg.${role}`, h("div.role", role, m.name ? ` (${m.name})` : "", m.tool_call_id
    ? ` for ${m.tool_call_id}` : ""), content ? h("div.content", String(content)) : null, calls);
}

/** OpenInference's flattened messages (llm.input_messages.0.message.role = ...) as [{role, content}]. */
function flatMessages(attrs, prefix) {
  const out = [];
  const pattern = new RegExp(`^${prefix.replace(/\./g, "\\.")}\\.(\\d+)\\.message\\.(role|content|name)$`);
  for (const [key, value] of Object.entries(attrs)) {
    const m = key.match(pattern);
    if (m) (out[Number(m[1])] ||= {})[m[2]] = value;
  }
  return out.filter(Boolean);
}

function attrValue(key, value) {
  if (Array.isArray(value) && value.length > 24 && value.every((x) => typeof x === "number")) {
    return `[${value.slice(0, 24).map((x) => fmtNum(x)).join(", ")}, ...] (${value.length} numbers)`;
  }
  return typeof value === "string" ? value : json(value, 0);
}

function spanPanel(span, rolloutId, attemptId) {
  const a = span.attributes || {};
  const kind = spanKind(span);
  const panel = h("div.panel#span-panel",
    h("h2", h(`span.kind.k-${kind}`, KIND_LABEL[kind]), spanTitle(span)),
    kvTable([["span", h("span.mono", span.span_id)], ["parent", h("span.mono", span.parent_id || "none")],
      ["name", span.name], ["status", `${span.status?.code || "UNSET"}${span.status?.description
        ? `: ${span.status.description}` : ""}`],
      ["start", fmtTime(span.start_time)], ["duration", fmtDuration((span.end_time ?? span.start_time)
        - span.start_time)]]));
  if (kind === "llm") {
    const request = maybeJson(a["agentbolt.llm.request_messages"] ?? a["llm.input_messages"]);
    const response = maybeJson(a["agentbolt.llm.response_message"]);
    const messages = Array.isArray(request) ? [...request] : flatMessages(a, "llm.input_messages");
    if (response && typeof response === "object") messages.push(response);
    else if (a["agentbolt.llm.response_text"]) messages.push({ role: "assistant", content: a["agentbolt.llm.response_text"] });
    else messages.push(...flatMessages(a, "llm.output_messages"));
    if (a["agentbolt.llm.error"]) panel.append(h("p.error", a["agentbolt.llm.error"]));
    if (messages.length) panel.append(h("h2", "Messages"), h("div.chat", messages.map(chatMessage)));
    if (a["agentbolt.llm.response_token_ids"]) {
      panel.append(h("p", h("a", { href: href(["rollouts", rolloutId, "tokens"], { attempt: attemptId, span:
        span.span_id }) }, "Tokens of this call \u2192")));
    }
  }
  const keys = Object.keys(a).sort();
  panel.append(h("h2", "Attributes"), keys.length ? h("table.attrs", h("tbody", keys.map((k) => h("tr",
    { "data-attr": k }, h("td", k), h("td", attrValue(k, a[k])))))) : message("none"));
  return panel;
}

// ---------------------------------------------------------------------------------------------- tokens

/** Background for a token of probability exp(logprob): red (unlikely) through yellow to green (likely). */
function probColor(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)}, ${p > 0.5 ? 55 : 75}%, 78%)`;
}

function tokenText(tok) {
  if (tok.text === null || tok.text === undefined) return [`\u27E8${tok.id}\u27E9`, true];
  return [tok.text.replace(/\n/g, "\u21B5\n"), false];
}

/** The transition's advantage: a number, "per token" (gae: hover the tokens), or "none". */
function advantageText(tr) {
  if (tr.advantage !== null && tr.advantage !== undefined) return fmtNum(tr.advantage);
  return tr.response.some((tok) => tok.advantage !== null && tok.advantage !== undefined)
    ? "per token (hover a token)" : "none";
}

/** Where the advantage comes from: the values the trainer recorded for the update, or a recomputation. */
function advantageSource(tr) {
  const settings = `${tr.advantage_estimator}, ${tr.credit_assignment} credit`;
  if (tr.advantage_source === "trained") {
    let text = `as trained at step ${tr.train_step} (${settings})`;
    if (tr.sample_index === null || tr.sample_index === undefined) text += "; this call was not in the batch";
    else if (tr.trained === false) text += "; not learned from (advantage 0, or dropped as stale)";
    if (tr.staleness !== null && tr.staleness !== undefined) {
      text += `; ${tr.staleness} version${tr.staleness === 1 ? "" : "s"} behind, weight ${fmtNum(tr.staleness_weight)}`;
    }
    return text;
  }
  if (tr.advantage_source === "recomputed") {
    return `recomputed (${settings}): the trainer recorded none for this rollout; the run may have used other settings`;
  }
  return "none (not a trained rollout)";
}

async function tokensPage(root, parts, params) {
  const id = parts[1];
  const { attempts, attempt } = await chosenAttempt(id, params);
  append(root, rolloutTabs(id, "tokens", attempt?.attempt_id));
  if (!attempt) { root.append(message("This rollout has no attempt yet.")); return; }
  const transitions = await optional(`/v1/rollouts/${encodeURIComponent(id)}/transitions?attempt_id=${
    encodeURIComponent(attempt.attempt_id)}`);
  append(root, [h("h1", "Tokens of ", h("span.mono", attempt.attempt_id)),
    unknownAttempt(params, attempt), attemptPicker(id, "tokens", attempts, attempt.attempt_id)]);
  if (transitions === null) { root.append(message("This server has no transitions endpoint.")); return; }
  if (!transitions.length) {
    root.append(message("No transition: this attempt made no LLM call with exact token ids.")); return;
  }
  const spanParam = params.get("span");
  let index = spanParam ? transitions.findIndex((t) => t.span_id === spanParam) : -1;
  if (index < 0) index = Math.min(Math.max(Number(params.get("t")) || 0, 0), transitions.length - 1);
  const tr = transitions[index];
  const picker = h("p", "Transition: ", transitions.map((t, i) => [h(`a${i === index ? ".active" : ""}`,
    { href: href(["rollouts", id, "tokens"], { attempt: attempt.attempt_id, t: i }) },
    `#${t.index ?? i}${t.agent_name ? ` ${t.agent_name}` : ""}`), " "]));
  const info = h("div#tok-info.muted", "Hover a token for its id and logprob.");
  const show = (text) => () => { info.textContent = text; info.classList.remove("muted"); };
  const promptToks = tr.prompt.map((tok) => {
    const [text, special] = tokenText(tok);
    const tip = `prompt token · id ${tok.id}`;
    return h(`span.tok.prompt${special ? ".special" : ""}`, { title: tip, onmouseenter: show(tip) }, text);
  });
  const responseToks = tr.response.map((tok, i) => {
    const [text, special] = tokenText(tok);
    const masked = tok.loss_mask === 0 || tok.loss_mask === false;
    const lp = tok.logprob;
    const adv = tok.advantage === null || tok.advantage === undefined ? "" : ` · advantage ${fmtNum(tok.advantage)}`;
    const tip = `response token ${i} · id ${tok.id} · logprob ${lp === null || lp === undefined ? "none"
      : `${lp.toFixed(4)} · p ${Math.exp(lp).toFixed(3)}`} · loss_mask ${masked ? 0 : 1}${adv}`;
    return h(`span.tok.response${masked ? ".masked" : ""}${special ? ".special" : ""}`, {
      title: tip, "data-logprob": lp, onmouseenter: show(tip),
      style: { background: lp === null || lp === undefined ? "#eaeef2" : probColor(lp) },
    }, text);
  });
  append(root, [picker,
    kvTable([["transition", `#${tr.index ?? index} of ${transitions.length}`],
      ["span", tr.span_id ? h("a.mono", { href: href(["rollouts", id, "trace"], { attempt: attempt.attempt_id,
        span: tr.span_id }) }, tr.span_id) : ""],
      ["agent", tr.agent_name || h("span.muted", "none")], ["model version", tr.model_version || ""],
      ["reward", h("span#tr-reward", tr.reward === null ? "none" : fmtNum(tr.reward))],
      ["advantage", h("span#tr-advantage", advantageText(tr))],
      ["advantage source", h("span#tr-advantage-source", advantageSource(tr))],
      ...(tr.sample_index === null || tr.sample_index === undefined ? [] : [["sample", h("span#tr-sample",
        `#${tr.sample_index} of step ${tr.train_step}'s batch, ${tr.sample_span_ids.length} call`
        + `${tr.sample_span_ids.length === 1 ? "" : "s merged"}`)]]),
      ["tokens", `${tr.prompt.length} prompt, ${tr.response.length} response`]]),
    h("p.muted", "Response tokens are colored by probability: ", h("span.scale"),
      " low \u2192 high; dimmed: loss mask 0 (not trained). Prompt tokens are gray."),
    [...tr.prompt, ...tr.response].some((tok) => tok.text === null || tok.text === undefined)
      ? h("p.note#no-token-text", "Served without a model: token texts unavailable, tokens show their ids \u27E8id\u27E9 "
        + "(agentbolt serve --model ... decodes them).") : null,
    info,
    h("h2", "Prompt"), h("div.tokens#prompt-tokens", promptToks),
    h("h2", "Response"), h("div.tokens#response-tokens", responseToks)]);
}

// ---------------------------------------------------------------------------------------------- resources

/** Line diff by longest common subsequence: [{op: "same"|"del"|"add", a, b}] (a/b: the line on each side). */
function diffLines(left, right) {
  const a = left.split("\n");
  const b = right.split("\n");
  const n = a.length;
  const m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Int32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push({ op: "same", a: a[i++], b: b[j++] }); }
    else if (j < m && (i === n || lcs[i][j + 1] >= lcs[i + 1][j])) { out.push({ op: "add", b: b[j++] }); }
    else { out.push({ op: "del", a: a[i++] }); }
  }
  return out;
}

function diffView(name, leftId, rightId, left, right) {
  const cells = [h("div.head", `${name} @ ${leftId}`), h("div.head", `${name} @ ${rightId}`)];
  if (left === null || right === null) {
    cells.push(h("div.line", left ?? h("span.muted", "(not in this version)")),
      h("div.line", right ?? h("span.muted", "(not in this version)")));
    return h("div.diff", { "data-template": name }, cells);
  }
  for (const d of diffLines(left, right)) {
    if (d.op === "same") cells.push(h("div.line", h("span.mark", " "), d.a), h("div.line", h("span.mark", " "), d.b));
    else if (d.op === "del") cells.push(h("div.line.del", h("span.mark", "-"), d.a), h("div.line.empty"));
    else cells.push(h("div.line.empty"), h("div.line.add", h("span.mark", "+"), d.b));
  }
  return h("div.diff", { "data-template": name }, cells);
}

function templates(version) {
  const out = {};
  for (const [name, res] of Object.entries(version?.resources || {})) {
    if (res.resource_type === "prompt_template") out[name] = res.template;
  }
  return out;
}

function describeResource(res) {
  if (res.resource_type === "llm") return `LLM ${res.model} at ${res.endpoint}`;
  if (res.resource_type === "prompt_template") {
    const first = res.template.split("\n")[0];
    return `prompt template: ${first.length > 60 ? `${first.slice(0, 60)}...` : first}`;
  }
  return json(res, 0);
}

async function resourcesPage(root, parts, params) {
  const [versions, scores] = await Promise.all([cached("/v1/resources"), optional("/v1/resources/scores")]);
  append(root, h("h1", "Resources"));
  if (!versions.length) { root.append(message("No resources version yet.")); return; }
  const scoreCell = (rid) => {
    const s = scores?.[rid];
    if (!s) return h("td.num.muted", scores ? "no finished rollout with a reward" : "");
    const modes = Object.entries(s.by_mode || {}).map(([mode, v]) =>
      `${mode}: ${fmtNum(v.mean_reward ?? v)}${v.n !== undefined ? ` (n=${v.n})` : ""}`).join(", ");
    return h("td.num", { title: modes }, `${fmtNum(s.mean_reward)} (n=${s.n})`, modes ? h("div.muted", modes) : null);
  };
  const rows = [...versions].reverse().map((v) => h("tr", { "data-resources": v.resources_id },
    h("td.mono", h("a", { href: href(["rollouts"], { resources_id: v.resources_id }) }, v.resources_id)),
    h("td", fmtTime(v.create_time)),
    h("td", Object.entries(v.resources).map(([name, res]) => h("div", h("b", name), ": ", describeResource(res)))),
    h("td", Object.keys(v.metadata || {}).length ? h("code", json(v.metadata, 0)) : ""),
    scoreCell(v.resources_id)));
  root.append(table(["Version", "Created", "Resources", "Metadata", h("th.num", "Mean reward")], rows,
    { id: "resources-table" }));

  const ids = versions.map((v) => v.resources_id);
  const leftId = ids.includes(params.get("a")) ? params.get("a") : ids.at(-2) ?? ids[0];
  const rightId = ids.includes(params.get("b")) ? params.get("b") : ids.at(-1);
  const pick = (name, current) => h("select", { name, onchange: (ev) => navigate(["resources"],
    { a: leftId, b: rightId, [name]: ev.target.value }) }, ids.map((x) => h("option", { value: x, selected: x === current },
    x)));
  root.append(h("h2", "Prompt templates: ", pick("a", leftId), " \u2192 ", pick("b", rightId)));
  const left = templates(versions.find((v) => v.resources_id === leftId));
  const right = templates(versions.find((v) => v.resources_id === rightId));
  const names = [...new Set([...Object.keys(left), ...Object.keys(right)])].sort();
  if (!names.length) root.append(message("Neither version has a prompt template."));
  for (const name of names) root.append(diffView(name, leftId, rightId, left[name] ?? null, right[name] ?? null));
}

// ---------------------------------------------------------------------------------------------- runners

async function runnersPage(root) {
  const workers = await api("/v1/workers");
  append(root, h("h1", "Runners"));
  if (!workers.length) { root.append(message("No runner has reported to this store.")); return; }
  const rows = workers.map((w) => h("tr", { "data-worker": w.worker_id },
    h("td.mono", w.worker_id), h("td", badge(w.status)),
    h("td", w.current_rollout_id ? h("a.mono", { href: href(["rollouts", w.current_rollout_id, "trace"],
      { attempt: w.current_attempt_id }) }, w.current_rollout_id) : h("span.muted", "none")),
    h("td.mono", w.current_attempt_id || ""),
    h("td", { title: fmtTime(w.last_heartbeat_time) }, fmtAgo(w.last_heartbeat_time)),
    h("td", Object.keys(w.metadata || {}).length ? h("code", json(w.metadata, 0)) : "")));
  root.append(table(["Runner", "Status", "Current rollout", "Attempt", "Last heartbeat", "Metadata"], rows,
    { id: "runners-table" }));
}

// ---------------------------------------------------------------------------------------------- charts

/** Tick labels with as many decimals as the finest tick needs (0.0001, 0.0002... not 0, 0...). */
function tickLabels(splits) {
  let digits = 0;
  const finite = splits.filter((v) => v !== null && Number.isFinite(v));
  const step = finite.length > 1 ? Math.abs(finite[1] - finite[0]) : Math.abs(finite[0] || 1);
  for (const v of finite) {
    let d = 0;
    while (d < 12 && Math.abs(Number(v.toFixed(d)) - v) > step * 1e-3) d++;
    digits = Math.max(digits, d);
  }
  return splits.map((v) => (v === null || !Number.isFinite(v) ? "" : Math.abs(v) >= 1e6 || (v !== 0 && digits > 8)
    ? v.toExponential(2) : v.toFixed(digits)));
}

/** A legend value: 4 significant digits (integers bare). */
function fmtSig(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return null;
  return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
}

/** The last non-null value of a series (what the legend shows when the cursor is not on the chart). */
function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i];
  return null;
}

/** The y range: uPlot's padded one, but a flat series (every reward 0...) gets value \u00B1 1, not 0 to 100. */
function yRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  return min === max ? [min - 1, max + 1] : window.uPlot.rangeNum(min, max, 0.1, true);
}

/** A uPlot line chart of xs and named series [{label, values, stroke, band?}] into a titled card. */
function chart(title, xs, series, opts = {}) {
  const card = h("div.chart", { "data-chart": title }, opts.bare ? null : h("h3", title));
  const width = opts.width || 460;
  const defs = [{ label: opts.xLabel || "train step" }];
  const data = [xs];
  const bands = [];
  for (const s of series) {
    if (s.band) {
      const lo = data.length;
      data.push(s.band[0], s.band[1]);
      defs.push({ label: `${s.label} \u2212std`, stroke: "transparent", points: { show: false } },
        { label: `${s.label} +std`, stroke: "transparent", points: { show: false } });
      bands.push({ series: [lo + 1, lo], fill: "rgba(9,105,218,0.12)" });
    }
    data.push(s.values);
    defs.push({ label: s.label, stroke: s.stroke || "#0969da", width: 2, spanGaps: true,
      ...(opts.bars ? { paths: window.uPlot.paths.bars({ size: [0.8, 40] }), fill: s.stroke } : {}) });
  }
  // legend: the hovered point's values, else the latest point's (not "--")
  const xFmt = opts.time ? (v) => fmtTime(v) : fmtSig;
  defs.forEach((d, i) => {
    const fmt = i === 0 ? xFmt : fmtSig;
    d.value = (u, v, sidx, idx) => fmt(idx === null || idx === undefined ? lastValue(data[sidx]) : v);
  });
  const build = () => {
    const u = new window.uPlot({ width: Math.max(card.clientWidth - 16, 300) || width, height: 200,
      series: defs, bands, scales: { x: { time: Boolean(opts.time) }, y: { range: opts.yRange || yRange } },
      legend: { live: true },
      axes: [opts.time ? {} : { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] },
        { values: (self, splits) => tickLabels(splits), size: 60 }] }, data, card);
    u.setLegend({ idx: null });
    return u;
  };
  // uPlot measures its container, so build once the card is in the page.
  requestAnimationFrame(() => { if (window.uPlot && card.isConnected) build(); });
  return card;
}

const COLORS = ["#0969da", "#8250df", "#1a7f37", "#bf8700", "#cf222e", "#1b7c83", "#6e7781"];

// ---------------------------------------------------------------------------------------------- errors

const ERROR_BUCKET_S = 60;
const ERROR_BUCKETS_SHOWN = 30;

/** The [t, count] buckets with the empty ones in between (and before, to show at least 30) filled with 0. */
function filledBuckets(series, bucketS) {
  if (!series.length) return { xs: [], counts: [] };
  const at = new Map(series.map(([t, c]) => [Math.round(t / bucketS), c]));
  const last = Math.max(...at.keys());
  const first = Math.max(Math.min(...at.keys(), last - ERROR_BUCKETS_SHOWN + 1), last - 10 * ERROR_BUCKETS_SHOWN);
  const xs = [];
  const counts = [];
  for (let b = first; b <= last; b++) {
    xs.push(b * bucketS);
    counts.push(at.get(b) ?? 0);
  }
  return { xs, counts };
}

async function errorsPage(root) {
  const summary = await optional(`/v1/errors/summary?bucket_s=${ERROR_BUCKET_S}`);
  append(root, h("h1", "Errors"));
  if (summary === null) { root.append(message("This server has no error summary endpoint.")); return; }
  if (!summary.kinds.length) { root.append(message("No errors recorded.")); return; }
  const cards = summary.kinds.map((k, i) => {
    const { xs, counts } = filledBuckets(k.series, ERROR_BUCKET_S);
    const card = h("div.chart.error-kind", { "data-kind": k.kind },
      h("h3", `${k.label || k.kind}: ${k.count}`),
      k.example ? h("p", h("a", { href: href(["rollouts", k.example.rollout_id, "trace"],
        { attempt: k.example.attempt_id }) }, `example trace: ${k.example.rollout_id}`)) : null);
    if (xs.length) {
      card.append(chart(`${k.kind} per minute`, xs, [{ label: "count", values: counts,
        stroke: COLORS[(i + 4) % COLORS.length] }], { time: true, bars: true, xLabel: "time", bare: true }));
    }
    return card;
  });
  root.append(h("div.cards", cards));
}

// ---------------------------------------------------------------------------------------------- training

function curve(points, xs) {
  const at = new Map(points.map((p) => [p.train_step, p.value]));
  return xs.map((x) => (at.has(x) ? at.get(x) : null));
}

/** The reward per step chart: the mean, and a band of mean \u00B1 std where std is known. */
function rewardChart(xs, mean, std) {
  const band = std ? [mean.map((v, i) => (v === null || std[i] === null ? null : v - std[i])),
    mean.map((v, i) => (v === null || std[i] === null ? null : v + std[i]))] : undefined;
  return chart("Reward per step (mean \u00B1 std)", xs, [{ label: "train_reward_mean", values: mean, band }]);
}

async function trainingPage(root, parts, params, current) {
  const draw = async () => {
    const metrics = await api("/v1/metrics");
    const byName = new Map();
    for (const m of metrics) {
      if (!byName.has(m.name)) byName.set(m.name, []);
      byName.get(m.name).push(m);
    }
    const body = h("div#training");
    if (!metrics.length) {
      body.append(message("No training metric yet. Curves appear here while agentbolt train runs."));
      return body;
    }
    const steps = (names) => [...new Set(names.flatMap((n) => (byName.get(n) || []).map((m) => m.train_step)))]
      .sort((x, y) => x - y);
    const charts = [];
    const group = (title, names, opts = {}) => {
      names = names.filter((n) => byName.has(n));
      if (!names.length) return;
      const xs = steps(names);
      charts.push(chart(title, xs, names.map((n, i) => ({ label: n, values: curve(byName.get(n), xs),
        stroke: COLORS[i % COLORS.length] })), opts));
    };
    if (byName.has("train_reward_mean")) {
      const xs = steps(["train_reward_mean"]);
      const mean = curve(byName.get("train_reward_mean"), xs);
      const std = byName.has("train_reward_std") ? curve(byName.get("train_reward_std"), xs) : null;
      charts.push(rewardChart(xs, mean, std));
    }
    const names = [...byName.keys()];
    // a fraction: always 0..1 (all-zero curves were drawn on -1..1)
    group("Validation accuracy", names.filter((n) => n.startsWith("val_")), { yRange: [0, 1] });
    group("Throughput (tokens/s)", names.filter((n) => n.endsWith("tokens_per_s")));
    group("Update KL", names.filter((n) => n.startsWith("update_") && n.includes("kl")));
    group("Clip fraction", names.filter((n) => n.includes("clip_fraction")));
    group("Time per step (s)", ["rollout_s", "update_s", "wait_s"]);
    body.append(h("div.charts", charts));
    const latest = names.sort().map((n) => {
      const pts = byName.get(n);
      const last = pts.at(-1);
      return h("tr", { "data-metric": n }, h("td.mono", n), h("td.num", last.train_step), h("td.num", fmtNum(last.value)),
        h("td.num", pts.length), h("td", fmtTime(last.time)));
    });
    body.append(h("h2", "Latest values"), table(["Metric", h("th.num", "Step"), h("th.num", "Value"),
      h("th.num", "Points"), "Time"], latest, { id: "metrics-table" }));
    return body;
  };
  const status = h("p.muted#training-status", `Refreshes every ${REFRESH_MS / 1000} s.`);
  let body = await draw();
  append(root, [h("h1", "Training"), status, body]);
  timer = setInterval(async () => {
    if (!current()) return;
    try {
      const fresh = await draw();
      if (!current()) return;
      body.replaceWith(fresh);
      body = fresh;
      status.textContent = `Refreshes every ${REFRESH_MS / 1000} s. Updated ${fmtTime(Date.now() / 1000)}.`;
    } catch (err) {
      status.textContent = `Refresh failed: ${err.message}`;
    }
  }, REFRESH_MS);
}

// ---------------------------------------------------------------------------------------------- run

function fmtPct(x) {
  return x === null || x === undefined ? "" : `${(x * 100).toFixed(1)}%`;
}

/** A shell command with a Copy button (the clipboard needs a secure context: elsewhere the text is selected). */
function commandBox(text, kind) {
  const code = h("code.command", { "data-command": kind }, text);
  const button = h("button.copy", { type: "button", title: "copy the command" }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch {
      const range = document.createRange();
      range.selectNodeContents(code);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      button.textContent = "Selected";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return h("div.command-box", code, button);
}

function segmentText(segment) {
  if (segment.resumed_from_step === null) return `started ${fmtTime(segment.start_time)}`;
  const changed = segment.changed.length ? `; settings changed: ${segment.changed.join(", ")}` : "";
  return `resumed from step ${segment.resumed_from_step} at ${fmtTime(segment.start_time)}${changed}`;
}

function validationTable(validation) {
  if (!validation.rows.length) {
    return message("No validation accuracy recorded (val_size 0, or eval_before / eval_after off).");
  }
  const rows = validation.rows.map((r) => h("tr", { "data-step": r.train_step },
    h("th", { title: [r.model_version, r.checkpoint].filter(Boolean).join(" ") }, r.label),
    h("td.num", r.train_step),
    validation.sets.map((name) => h("td.num", fmtPct(r.accuracy[name]))),
    h("td.num", fmtPct(r.mean_accuracy))));
  return table(["", h("th.num", "After step"), ...validation.sets.map((name) => h("th.num", name)),
    h("th.num", "Mean")], rows, { id: "validation-table" });
}

function trainedCell(s) {
  if (s.trained_samples === null) return h("td.num", s.n_samples ?? "");
  const skipped = s.stepped && s.n_skipped_zero_advantage ? h("div.muted",
    `${s.n_skipped_zero_advantage} with advantage 0 skipped`) : null;
  return h("td.num", s.n_samples === null ? String(s.trained_samples) : `${s.trained_samples} of ${s.n_samples}`,
    skipped);
}

function stepsTable(run) {
  if (!run.steps.length) return message("No training step recorded yet.");
  const width = 11;
  const rows = [];
  let segment = 0;
  for (const s of run.steps) {
    if (s.segment !== segment) {
      segment = s.segment;
      rows.push(h("tr.segment-row", h("td", { colspan: width }, segmentText(run.segments[segment]))));
    }
    const update = s.stepped === null ? h("td") : s.stepped ? h("td", "stepped")
      : h("td.skipped", s.skipped_reason || "update skipped");
    rows.push(h("tr", { "data-step": s.train_step },
      h("td.num", s.train_step),
      h("td.num", s.reward_mean === null ? "" : `${fmtNum(s.reward_mean)}${s.reward_std === null ? ""
        : ` \u00B1 ${fmtNum(s.reward_std)}`}`),
      h("td.num", s.n_rollouts ?? ""),
      h("td.num", [s.n_failed_rollouts, s.n_infra_failed_rollouts].every((x) => x === null) ? ""
        : `${s.n_failed_rollouts ?? 0}${s.n_infra_failed_rollouts ? ` (${s.n_infra_failed_rollouts} infra)` : ""}`),
      trainedCell(s),
      update,
      h("td.num", fmtNum(s.loss)), h("td.num", fmtNum(s.approx_kl)), h("td.num", fmtNum(s.grad_norm)),
      h("td.num", fmtDuration(s.rollout_s)), h("td.num", fmtDuration(s.update_s))));
  }
  return table([h("th.num", "Step"), h("th.num", "Reward"), h("th.num", "Rollouts"), h("th.num", "Failed"),
    h("th.num", "Samples trained"), "Update", h("th.num", "Loss"), h("th.num", "KL"), h("th.num", "Grad norm"),
    h("th.num", "Rollouts time"), h("th.num", "Update time")], rows, { id: "steps-table" });
}

function checkpointsTable(run) {
  if (!run.checkpoints.length) return message("No checkpoint recorded.");
  const rows = run.checkpoints.map((c) => h("tr", { "data-checkpoint": c.train_step, "data-state": c.state },
    h("td.num", c.train_step),
    h("td.mono", c.model_version || ""),
    h("td.mono", c.path),
    h("td", h(`span.badge.${c.state}`, c.state_label)),
    h("td.num", fmtPct(c.mean_accuracy), c.best ? [" ", h("span.badge.best", "best")] : null),
    h("td", c.state === "pruned" ? h("span.muted", "the weights were deleted")
      : [c.serve_command ? commandBox(c.serve_command, "serve") : null, commandBox(c.eval_command, "eval")])));
  return table([h("th.num", "Step"), "Weights", "Folder", "State", h("th.num", "Validation"), "Commands"], rows,
    { id: "checkpoints-table" });
}

async function runPage(root, parts, params) {
  const runs = await api("/v1/runs");
  append(root, h("h1", "Run"));
  if (!runs.length) {
    root.append(message("No train job is recorded in this store: agentbolt train records its config, steps and " +
      "checkpoints here when it starts. The Training page shows whatever metrics there are."));
    return;
  }
  const wanted = params.get("run");
  const chosen = runs.find((r) => r.run_id === wanted) || runs.at(-1);
  const run = await api(`/v1/runs/${encodeURIComponent(chosen.run_id)}`);
  if (runs.length > 1) {
    const options = runs.map((r) => h("option", { value: r.run_id, selected: r.run_id === run.run_id },
      `${r.run_id} (${fmtTime(r.start_time)}, ${r.model || "?"})`));
    const pick = (ev) => navigate(["run"], { run: ev.target.value });
    root.append(h("p", "Run: ", h("select#run-picker", { onchange: pick }, options)));
  }
  if (wanted && wanted !== run.run_id) root.append(h("p.error#unknown-run", `No run ${wanted}; showing the latest.`));
  root.append(kvTable([
    ["run", h("span.mono", run.run_id)],
    ["model", run.model || h("span.muted", "not in the config")],
    ["output folder", run.out_dir ? h("span.mono", run.out_dir) : ""],
    ["job starts", h("div#run-segments", run.segments.map((seg) => h("div", segmentText(seg))))],
    ["last step", run.last_train_step ?? h("span.muted", "none yet")],
  ]));
  const withReward = run.steps.filter((s) => s.reward_mean !== null);
  if (withReward.length) {
    const xs = withReward.map((s) => s.train_step);
    const std = withReward.some((s) => s.reward_std !== null) ? withReward.map((s) => s.reward_std) : null;
    root.append(h("div.charts", rewardChart(xs, withReward.map((s) => s.reward_mean), std)));
  }
  append(root, [
    h("h2", "Validation accuracy"), validationTable(run.validation),
    h("h2", "Steps"), stepsTable(run),
    h("h2", "Checkpoints"), checkpointsTable(run),
    run.checkpoints.length ? h("p.hint", "Run the commands in the folder the train job ran in: the config's agent " +
      "and tasks modules are imported from there. agentbolt eval writes OUT/eval-step-N-val beside the checkpoints.")
      : null,
    h("h2", "Config"),
    h("p.hint", run.segments.length > 1 ? "As resolved when the job last started (its latest resume)."
      : "As resolved when the job started (every default filled in)."),
    h("pre#run-config", json(run.config)),
  ]);
}

// ---------------------------------------------------------------------------------------------- start

function takeTokenFromHash() {
  const m = location.hash.match(/^#token=([^&]*)(?:&(.*))?$/);
  if (!m) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  history.replaceState(null, "", `${location.pathname}${location.search}#${m[2] ? m[2] : "/rollouts"}`);
}

document.getElementById("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = document.getElementById("auth-token").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  document.getElementById("auth-token").value = "";
  memo.clear();
  render();
});
window.addEventListener("hashchange", () => { takeTokenFromHash(); render(); });
takeTokenFromHash();
if (!location.hash) history.replaceState(null, "", "#/rollouts");
render();
