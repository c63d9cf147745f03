// turnstile's web console: plain JavaScript, no build step, served from the binary.
// It reads the HTTP API with the key (or signed token) kept in this tab's sessionStorage; every page
// reads paginated or per-session routes, never the whole journal.
"use strict";

const KEY = "turnstile-api-key";
const main = document.getElementById("main");
const errorBox = document.getElementById("error");

// ---- helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function status(value) {
  return el("span", { class: `status ${value || ""}` }, value || "—");
}

function when(seconds) {
  if (!seconds) return "—";
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);
}

class ApiError extends Error {
  constructor(statusCode, body) {
    super(body.detail || `HTTP ${statusCode}`);
    this.status = statusCode;
    this.errorType = body.error_type;
  }
}

function headers(extra) {
  const key = sessionStorage.getItem(KEY);
  const all = Object.assign({}, extra || {});
  if (key) all.Authorization = `Bearer ${key}`;
  return all;
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (!response.ok) {
    let body = {};
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, body);
  }
  const type = response.headers.get("content-type") || "";
  if (response.status === 204) return null;
  return type.includes("application/json") ? response.json() : response.text();
}

function form(fields) {
  return { method: "POST", body: new URLSearchParams(fields),
           headers: { "Content-Type": "application/x-www-form-urlencoded" } };
}

function showError(error) {
  let text;
  if (error instanceof ApiError && error.status === 401) {
    text = "The server needs its API key or a token: enter it above (it is kept in this tab only), then try again.";
  } else if (error instanceof ApiError && error.status === 403) {
    text = `Your token does not allow this (403): ${error.message}`;
  } else if (error instanceof ApiError && error.status === 404) {
    text = `Not found: ${error.message}`;
  } else if (error instanceof ApiError && error.status === 409) {
    text = `Refused (409 ${error.errorType || "conflict"}): ${error.message}`;
  } else if (error instanceof ApiError) {
    text = `The server refused (${error.status}): ${error.message}`;
  } else {
    text = `Could not reach the server: ${error.message}`;
  }
  errorBox.textContent = text;
  errorBox.dataset.status = error.status || "";
  errorBox.hidden = false;
}

function clearError() {
  errorBox.hidden = true;
  errorBox.textContent = "";
}

// ---- sessions ------------------------------------------------------------------

async function sessionsPage(params) {
  const page = Math.max(1, parseInt(params.get("page") || "1", 10));
  const search = params.get("q") || "";
  const order = params.get("order") === "asc" ? "asc" : "desc";
  const query = new URLSearchParams({ limit: "20", page: String(page), sort_order: order });
  if (search) query.set("session_name", search);
  const listing = await api(`/sessions?${query}`);
  let rows = listing.data;
  if (search && page === 1) {
    // A search may be an id: the session itself first.
    try {
      const exact = await api(`/sessions/${encodeURIComponent(search)}`);
      rows = [exact].concat(rows.filter((row) => row.session_id !== exact.session_id));
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
    }
  }
  const details = await Promise.all(rows.map(async (row) => {
    const runs = await api(`/agents/${encodeURIComponent(row.agent_id)}/runs?session_id=${encodeURIComponent(row.session_id)}&limit=1`)
      .catch(() => ({ data: [], meta: { total_count: 0 } }));
    return { row, last: runs.data[0], runs: runs.meta.total_count };
  }));
  const go = (next) => {
    const q = new URLSearchParams(next);
    location.hash = `#/sessions?${q}`;
  };
  const searchBox = el("input", { type: "search", id: "search", value: search, placeholder: "id or name",
    "aria-label": "Search sessions by id or name" });
  const body = details.map(({ row, last, runs }) => el("tr", { class: "session-row" },
    el("td", { "data-label": "Session" }, el("a", { href: `#/session/${encodeURIComponent(row.session_id)}` }, row.session_id),
      el("div", { class: "pos" }, row.session_name)),
    el("td", { "data-label": "Agent" }, row.agent_id),
    el("td", { "data-label": "Last run" }, status(last && last.status)),
    el("td", { "data-label": "Runs" }, String(runs)),
    el("td", { "data-label": "Tokens" }, String(row.total_tokens || 0)),
    el("td", { "data-label": "Cost" }, row.metrics && row.metrics.cost != null ? `$${Number(row.metrics.cost).toFixed(4)}` : "—"),
    el("td", { "data-label": "Updated" }, when(row.updated_at))));
  const meta = listing.meta;
  main.replaceChildren(
    el("h1", {}, "Sessions"),
    el("form", { class: "controls", onsubmit: (event) => { event.preventDefault(); go({ q: searchBox.value, order, page: 1 }); } },
      searchBox, el("button", { type: "submit" }, "Search"),
      el("label", { for: "order" }, "Sort"),
      el("select", { id: "order", onchange: (event) => go({ q: search, order: event.target.value, page: 1 }) },
        el("option", { value: "desc", selected: order === "desc" }, "newest first"),
        el("option", { value: "asc", selected: order === "asc" }, "oldest first"))),
    el("table", { class: "sessions" },
      el("thead", {}, el("tr", {}, ["Session", "Agent", "Last run", "Runs", "Tokens", "Cost", "Updated"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, body.length ? body : el("tr", {}, el("td", { colspan: 7 }, "No sessions.")))),
    el("div", { class: "controls" },
      el("button", { disabled: page <= 1, onclick: () => go({ q: search, order, page: page - 1 }) }, "Previous"),
      el("span", {}, `page ${meta.page} of ${Math.max(1, meta.total_pages)} · ${meta.total_count} sessions`),
      el("button", { disabled: page >= meta.total_pages, onclick: () => go({ q: search, order, page: page + 1 }) }, "Next")));
}

// ---- a session's timeline ------------------------------------------------------

function variant(value) {
  if (typeof value === "string") return [value, {}];
  const name = Object.keys(value)[0];
  return [name, value[name]];
}

// The session's records (its own export: positions, every run, attempt, tool call,
// fork, compaction and attachment) folded into runs.
function fold(records) {
  const runs = new Map();
  const order = [];
  const session = [];
  const runOf = (id) => {
    if (!runs.has(id)) {
      runs.set(id, { id, pos: null, input: "", status: "PENDING", attempts: [], tools: [], warnings: [],
        attachments: [], fork: null, end: null, agent: null });
      order.push(id);
    }
    return runs.get(id);
  };
  for (const record of records) {
    const [name, event] = variant(record.event);
    if (name === "SessionCreated" || name === "SessionDeleted") {
      session.push({ pos: record.pos, text: name === "SessionCreated" ? `session created for agent ${event.agent_id}` : "session deleted" });
    } else if (name === "TranscriptCompacted") {
      session.push({ pos: record.pos, text: `compacted: ${event.replaced_messages} messages replaced by a summary`, compaction: true });
    } else if (name === "RunQueued") {
      const run = runOf(event.run_id);
      run.pos = record.pos; run.input = event.input; run.agent = event.agent_id;
    } else if (name === "RunStarted") {
      runOf(event.run_id).status = "RUNNING";
    } else if (name === "AttemptStarted") {
      runOf(event.run_id).attempts.push({ pos: record.pos, attempt: event.attempt });
    } else if (name === "AttemptFailed") {
      runOf(event.run_id).warnings.push({ pos: record.pos, text: `attempt ${event.attempt} failed (${event.error_type}${event.retryable ? ", retryable" : ""}): ${event.message}` });
    } else if (name === "HarnessSessionForked") {
      runOf(event.run_id).fork = { from: event.from_run_id, message: event.message_index, pos: record.pos };
    } else if (name === "AttachmentAdded") {
      runOf(event.run_id).attachments.push({ pos: record.pos, text: `${event.name} (${event.media_type})` });
    } else if (name === "RunCompleted" || name === "RunFailed" || name === "RunCancelled") {
      const run = runOf(event.run_id);
      run.status = { RunCompleted: "COMPLETED", RunFailed: "ERROR", RunCancelled: "CANCELLED" }[name];
      // A completed run's answer is on its Completed run event (and, in journals of
      // format 3, on RunCompleted too).
      run.end = { pos: record.pos, text: event.content || run.answer || event.message || event.reason || "" };
    } else if (name === "RunEventEmitted") {
      const run = runOf(event.run_id);
      const [kind, data] = variant(event.event);
      if (kind === "ToolCallStarted" || kind === "ToolCallCompleted") {
        const tool = data.tool;
        let known = run.tools.find((t) => t.tool_call_id === tool.tool_call_id);
        if (!known) { known = Object.assign({ pos: record.pos }, tool); run.tools.push(known); }
        Object.assign(known, tool, { done: kind === "ToolCallCompleted" || known.done });
      } else if (kind === "Completed") {
        run.answer = data.content;
      } else if (kind === "Warning") {
        const [type, warning] = variant(data.warning);
        if (type === "Retry") run.warnings.push({ pos: record.pos, retry: true, text: `retry: attempt ${warning.attempt} of ${warning.attempts} in ${warning.delay_s} s after ${warning.error_type}` });
        else if (type === "SessionFallback") run.warnings.push({ pos: record.pos, text: `fresh-session fallback: ${warning.error}` });
        else run.warnings.push({ pos: record.pos, text: type });
      }
    }
  }
  return { runs, order, session };
}

function toolTree(tools, parent, checkpoints, run, agent) {
  return tools.filter((tool) => (tool.parent_tool_call_id || null) === parent).map((tool) => {
    const checkpoint = checkpoints.find((c) => c.message_id === tool.tool_call_id);
    return el("div", { class: `tool${tool.tool_call_error ? " error" : ""}`, "data-tool": tool.tool_name, "data-call": tool.tool_call_id },
      el("div", { class: "tool-head" }, el("strong", {}, tool.tool_name), " ", el("span", { class: "pos" }, `#${tool.pos}`),
        tool.done ? "" : " (running)",
        checkpoint ? el("button", { class: "continue", onclick: () => continueRun(agent, run.id, checkpoint.continue_from) }, "Continue from here") : ""),
      tool.result ? el("div", { class: "pos" }, String(tool.result).slice(0, 200)) : "",
      toolTree(tools, tool.tool_call_id, checkpoints, run, agent));
  });
}

async function continueRun(agent, runId, from) {
  const input = prompt("Message to continue with", "go on");
  if (input === null) return;
  try {
    const started = await api(`/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}/continue`,
      form({ continue_from: String(from), input, stream: "false", background: "true" }));
    location.hash = `#/run/${encodeURIComponent(agent)}/${encodeURIComponent(started.run_id)}`;
  } catch (error) { showError(error); }
}

function runCard(run, folded, checkpoints, children) {
  const agent = run.agent;
  return el("section", { class: "run", "data-run": run.id, "data-status": run.status },
    el("div", {}, status(run.status), " ",
      el("a", { href: `#/run/${encodeURIComponent(agent)}/${encodeURIComponent(run.id)}` }, run.id), " ",
      el("span", { class: "pos" }, `#${run.pos}`),
      run.attempts.length > 1 ? el("span", { class: "attempts" }, ` · ${run.attempts.length} attempts`) : ""),
    run.fork ? el("div", { class: "item fork" }, `continues run ${run.fork.from} after message ${run.fork.message} `, el("span", { class: "pos" }, `#${run.fork.pos}`)) : "",
    el("div", { class: "item" }, el("strong", {}, "input: "), run.input.slice(0, 300)),
    run.attachments.map((a) => el("div", { class: "item attachment" }, `attachment ${a.text} `, el("span", { class: "pos" }, `#${a.pos}`))),
    run.warnings.map((w) => el("div", { class: `item warning${w.retry ? " retry" : ""}` }, w.text, " ", el("span", { class: "pos" }, `#${w.pos}`))),
    toolTree(run.tools, null, checkpoints, run, agent),
    run.end ? el("div", { class: "item end" }, el("strong", {}, "answer: "), run.end.text.slice(0, 500), " ", el("span", { class: "pos" }, `#${run.end.pos}`)) : "",
    children);
}

async function sessionPage(sessionId) {
  const session = await api(`/sessions/${encodeURIComponent(sessionId)}`);
  const text = await api(`/journal/export?session_id=${encodeURIComponent(sessionId)}`);
  const records = text.split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));
  const folded = fold(records);
  const checkpoints = new Map();
  await Promise.all(folded.order.map(async (id) => {
    const run = folded.runs.get(id);
    if (run.status === "RUNNING" || run.status === "PENDING") return;
    const listed = await api(`/agents/${encodeURIComponent(run.agent)}/runs/${encodeURIComponent(id)}/checkpoints`).catch(() => null);
    checkpoints.set(id, listed ? listed.checkpoints : []);
  }));
  // Forks as a tree: a continuation under the run it continues.
  const childrenOf = (parent) => folded.order
    .map((id) => folded.runs.get(id))
    .filter((run) => (run.fork ? run.fork.from : null) === parent)
    .map((run) => runCard(run, folded, checkpoints.get(run.id) || [], childrenOf(run.id)));
  const agent = session.agent_id;
  // The session's own records (creation, compactions) at their place in time among
  // the runs that are not forks (a fork sits under the run it continues).
  const timeline = folded.session.map((item) => ({ pos: item.pos,
    node: el("div", { class: `item session-item${item.compaction ? " compaction" : ""}` }, item.text, " ", el("span", { class: "pos" }, `#${item.pos}`)) }))
    .concat(childrenOf(null).map((node) => ({ pos: folded.runs.get(node.dataset.run).pos, node })))
    .sort((a, b) => (a.pos ?? Infinity) - (b.pos ?? Infinity))
    .map((entry) => entry.node);
  const outcome = el("p", { class: "item", id: "compact-outcome", "aria-live": "polite" }, compacted.get(sessionId) || "");
  compacted.delete(sessionId);
  main.replaceChildren(
    el("h1", {}, `Session ${session.session_id}`),
    el("p", {}, `agent ${agent} · ${session.metadata.runs} runs · ${session.total_tokens} tokens · harness session ${session.metadata.harness_session_id || "—"}`),
    el("div", { class: "controls" },
      el("button", { id: "compact", onclick: async () => {
        try {
          const done = await api(`/agents/${encodeURIComponent(agent)}/sessions/${encodeURIComponent(sessionId)}/compact`, { method: "POST" });
          // Drawn again, so the compaction shows at its place in the timeline.
          compacted.set(sessionId, `compaction: ${done.status}: ${done.message}`);
          await render();
        } catch (error) { showError(error); }
      } }, "Compact session")),
    outcome,
    ...timeline);
}

// What the last compaction from this page said, shown once the page is drawn again.
const compacted = new Map();

// ---- a live run ----------------------------------------------------------------

function describe(event) {
  const data = event.data;
  if (data.tool) return `${event.event} ${data.tool.tool_name}${data.tool.result ? `: ${String(data.tool.result).slice(0, 120)}` : ""}`;
  if (data.warning) return `${event.event} ${data.warning.type}`;
  if (data.content !== undefined && data.content !== "") return `${event.event}: ${typeof data.content === "string" ? data.content : JSON.stringify(data.content)}`;
  return event.event;
}

// ---- a run's files -------------------------------------------------------------

// The lines of `before` and `after` as a diff: each line with "+", "-" or " ", by their
// longest common subsequence (for files of at most 2,000 lines each).
function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  if (a.length > 2000 || b.length > 2000) return null;
  const common = Array.from({ length: a.length + 1 }, () => new Uint16Array(b.length + 1));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const lines = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { lines.push([" ", a[i]]); i++; j++; }
    else if (j < b.length && (i === a.length || common[i][j + 1] >= common[i + 1][j])) { lines.push(["+", b[j]]); j++; }
    else { lines.push(["-", a[i]]); i++; }
  }
  return lines;
}

// A file's text as recorded at a point of the run (`null`: absent then, or not text).
async function fileText(base, path, at) {
  const query = at ? `?at=${encodeURIComponent(at)}` : "";
  const response = await fetch(`${base}/files/${path.split("/").map(encodeURIComponent).join("/")}${query}`, { headers: headers() });
  if (response.status === 404) return "";
  if (!response.ok) return null;
  const bytes = new Uint8Array(await response.arrayBuffer());
  if (bytes.length > 256 * 1024) return null;
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch (_) { return null; }
}

// The files a run changed in its session's workspace, each with its diff (text files).
async function fillFiles(section, agent, runId) {
  const base = `/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}`;
  const changes = await api(`${base}/files`).catch(() => []);
  if (!changes.length) { section.replaceChildren(); return; }
  // Where each change's "after" is read, and the point before it for the same path.
  const lastPoint = new Map();
  const items = [];
  for (const change of changes) {
    const at = change.tool_call_id || (change.point === "turn_end" ? null : "start");
    const before = lastPoint.has(change.path) ? lastPoint.get(change.path) : "start";
    lastPoint.set(change.path, at);
    const sign = { added: "+", modified: "~", removed: "-" }[change.change] || "?";
    const detail = el("details", { class: "file", "data-path": change.path, "data-change": change.change },
      el("summary", {}, `${sign} ${change.path}`, " ",
        el("span", { class: "pos" }, change.size === null ? "removed" : `${change.size} bytes`),
        change.tool_call_id ? el("span", { class: "pos" }, ` after ${change.tool_call_id}`) : ""));
    detail.addEventListener("toggle", async () => {
      if (!detail.open || detail.dataset.loaded) return;
      detail.dataset.loaded = "1";
      const [old, now] = await Promise.all([
        change.change === "added" ? "" : fileText(base, change.path, before),
        change.change === "removed" ? "" : fileText(base, change.path, at),
      ]);
      const lines = old === null || now === null ? null : lineDiff(old, now);
      detail.append(lines === null
        ? el("p", { class: "item" }, `binary or large: sha256 ${change.digest || "—"}`)
        : el("pre", { class: "diff" }, lines.map(([mark, text]) =>
          el("span", { class: mark === "+" ? "added" : mark === "-" ? "removed" : "same" }, `${mark} ${text}\n`))));
    });
    items.push(detail);
  }
  section.replaceChildren(el("h2", {}, `Files (${changes.length} changes)`), ...items);
}

async function runPage(agent, runId) {
  const run = await api(`/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}`);
  const stored = `turnstile-run-${runId}`;
  const seen = JSON.parse(sessionStorage.getItem(stored) || "[]");
  const list = el("ol", { class: "events", id: "events", "aria-live": "polite" });
  const statusNode = el("span", { id: "run-status" }, status(run.status));
  const ended = (value) => ["COMPLETED", "ERROR", "CANCELLED"].includes(value);
  const add = (event) => list.append(el("li", { "data-event": event.event, "data-index": event.index }, `${event.index} ${describe(event)}`));
  seen.forEach(add);
  // Only a run that can still end offers to cancel it.
  const cancel = el("button", { id: "cancel", hidden: ended(run.status), onclick: async () => {
    try { await api(`/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}/cancel`, { method: "POST" }); clearError(); }
    catch (error) { showError(error); }
  } }, "Cancel run");
  const input = el("input", { id: "continue-input", value: "", placeholder: "message", "aria-label": "Message to continue with" });
  const files = el("section", { id: "files", "aria-live": "polite" });
  fillFiles(files, agent, runId);
  main.replaceChildren(
    el("h1", {}, "Run ", el("code", {}, runId)),
    el("p", {}, "status ", statusNode, " · session ", el("a", { href: `#/session/${encodeURIComponent(run.session_id)}` }, run.session_id)),
    el("div", { class: "controls" },
      cancel,
      input,
      el("button", { id: "continue", onclick: async () => {
        try {
          const started = await api(`/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}/continue`,
            form({ continue_from: "end", input: input.value || "go on", stream: "false", background: "true", session_id: run.session_id }));
          location.hash = `#/run/${encodeURIComponent(agent)}/${encodeURIComponent(started.run_id)}`;
        } catch (error) { showError(error); }
      } }, "Continue from the end")),
    files,
    list);
  // Re-attach after the events already shown (kept in this tab across reloads).
  const last = seen.length ? seen[seen.length - 1].index : null;
  const fields = last === null ? {} : { last_event_index: String(last) };
  const response = await fetch(`/agents/${encodeURIComponent(agent)}/runs/${encodeURIComponent(runId)}/resume`,
    Object.assign(form(fields), { headers: headers({ "Content-Type": "application/x-www-form-urlencoded" }) }));
  if (!response.ok) {
    let body = {};
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, body);
  }
  const showStatus = (value) => {
    statusNode.replaceChildren(status(value));
    cancel.hidden = ended(value);
  };
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const page = location.hash;
  for (;;) {
    const { value, done } = await reader.read();
    if (done || location.hash !== page) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      const lines = frame.split("\n");
      const id = lines.find((line) => line.startsWith("id: "));
      const dataLine = lines.find((line) => line.startsWith("data: "));
      if (!dataLine) continue;
      const data = JSON.parse(dataLine.slice(6));
      if (!id) {
        if (data.status) showStatus(data.status);
        continue;
      }
      const event = { index: Number(id.slice(4)), event: data.event, data };
      if (seen.length && event.index <= seen[seen.length - 1].index) continue;
      seen.push(event);
      sessionStorage.setItem(stored, JSON.stringify(seen.slice(-500)));
      add(event);
      const terminal = { RunCompleted: "COMPLETED", RunError: "ERROR", RunCancelled: "CANCELLED" }[data.event];
      if (terminal) { showStatus(terminal); fillFiles(files, agent, runId); }
    }
  }
}

// ---- metrics -------------------------------------------------------------------

function bars(title, points, format) {
  const width = 320, height = 140, pad = 24;
  const max = Math.max(1, ...points.map((p) => p.value));
  const step = points.length ? (width - pad) / points.length : 0;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  points.forEach((point, i) => {
    const h = ((height - pad) * point.value) / max;
    const rect = document.createElementNS(svg.namespaceURI, "rect");
    rect.setAttribute("x", pad + i * step + 2);
    rect.setAttribute("y", height - pad - h);
    rect.setAttribute("width", Math.max(2, step - 4));
    rect.setAttribute("height", h);
    rect.setAttribute("fill", "#2456c7");
    const tip = document.createElementNS(svg.namespaceURI, "title");
    tip.textContent = `${point.label}: ${format(point.value)}`;
    rect.append(tip);
    svg.append(rect);
    const label = document.createElementNS(svg.namespaceURI, "text");
    label.setAttribute("x", pad + i * step + 2);
    label.setAttribute("y", height - 8);
    label.textContent = point.label.slice(5);
    svg.append(label);
  });
  const top = document.createElementNS(svg.namespaceURI, "text");
  top.setAttribute("x", 0); top.setAttribute("y", 12);
  top.textContent = format(max);
  svg.append(top);
  return el("figure", { class: "chart" }, el("figcaption", {}, title), svg);
}

async function metricsPage() {
  const daily = await api("/metrics");
  const prometheus = await api("/metrics/prometheus");
  const days = daily.metrics;
  const models = new Map();
  for (const day of days) for (const m of day.model_metrics) models.set(m.model_id, (models.get(m.model_id) || 0) + m.count);
  const samples = prometheus.split("\n").filter((line) => line && !line.startsWith("#") && !line.includes("_bucket"));
  main.replaceChildren(
    el("h1", {}, "Metrics"),
    el("div", { class: "charts" },
      bars("Runs per day", days.map((d) => ({ label: d.id, value: d.agent_runs_count })), String),
      bars("Tokens per day", days.map((d) => ({ label: d.id, value: Number(d.token_metrics.total_tokens || 0) })), String),
      bars("Cost per day (USD)", days.map((d) => ({ label: d.id, value: Number(d.token_metrics.cost || 0) })), (v) => v.toFixed(4)),
      bars("Completed runs per model", [...models].map(([model, count]) => ({ label: `     ${model}`, value: count })), String)),
    el("h2", {}, "Counters now"),
    el("table", { class: "counters" }, el("tbody", {}, samples.map((line) => {
      const at = line.lastIndexOf(" ");
      return el("tr", {}, el("td", {}, line.slice(0, at)), el("td", {}, line.slice(at + 1)));
    }))));
}

// ---- approvals -------------------------------------------------------------------

// Decides every pending call of a paused run at once (every pending call must be decided),
// with the run's note; the run goes on in the background.
async function decideRun(row, confirmed, note) {
  const tools = row.calls.map((call) => ({ tool_call_id: call.tool_call_id, confirmed, confirmation_note: note || null }));
  await api(`/agents/${encodeURIComponent(row.agent_id)}/runs/${encodeURIComponent(row.run_id)}/continue`,
    form({ tools: JSON.stringify(tools), session_id: row.session_id, stream: "false", background: "true" }));
}

async function approvalsPage(params) {
  const page = Math.max(1, parseInt(params.get("page") || "1", 10));
  const listing = await api(`/approvals?limit=100&page=${page}`);
  const runs = new Map();
  for (const call of listing.data) {
    if (!runs.has(call.run_id)) runs.set(call.run_id, { ...call, calls: [] });
    runs.get(call.run_id).calls.push(call);
  }
  const rows = [...runs.values()].map((row) => {
    const note = el("input", { type: "text", class: "note", placeholder: "note (told to the model when denied)",
      "aria-label": `Note for run ${row.run_id}` });
    const act = (confirmed) => async (event) => {
      event.target.disabled = true;
      try {
        await decideRun(row, confirmed, note.value);
        await approvalsPage(params);
      } catch (error) {
        showError(error);
        event.target.disabled = false;
      }
    };
    return el("tr", { class: "approval", "data-run": row.run_id },
      el("td", { "data-label": "Run" },
        el("a", { href: `#/run/${encodeURIComponent(row.agent_id)}/${encodeURIComponent(row.run_id)}` }, row.run_id),
        el("div", { class: "pos" }, `${row.agent_id} · session ${row.session_id}`)),
      el("td", { "data-label": "Waiting" }, row.calls.map((call) =>
        el("div", { class: "call" }, el("code", {}, call.tool_name), " ", el("code", {}, JSON.stringify(call.tool_args))))),
      el("td", { "data-label": "Since" }, when(row.paused_at)),
      el("td", { "data-label": "Decide" }, note,
        el("button", { type: "button", class: "approve", onclick: act(true) }, "Approve"),
        el("button", { type: "button", class: "deny", onclick: act(false) }, "Deny")));
  });
  main.replaceChildren(
    el("h1", {}, "Approvals"),
    el("p", {}, `${listing.meta.total_count} tool call(s) waiting for a decision, oldest first.`),
    rows.length === 0 ? el("p", { class: "empty" }, "Nothing is waiting.") :
      el("table", { class: "approvals" },
        el("thead", {}, el("tr", {}, ["Run", "Waiting", "Since", "Decide"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows)));
}

// ---- routing -------------------------------------------------------------------

async function render() {
  clearError();
  const hash = location.hash || "#/sessions";
  const [path, query] = hash.slice(1).split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "session" && parts[1]) await sessionPage(parts[1]);
    else if (parts[0] === "run" && parts[2]) await runPage(parts[1], parts[2]);
    else if (parts[0] === "metrics") await metricsPage();
    else if (parts[0] === "approvals") await approvalsPage(new URLSearchParams(query || ""));
    else await sessionsPage(new URLSearchParams(query || ""));
  } catch (error) {
    showError(error);
    // The banner says what happened; nothing stale stays under it.
    if (!main.querySelector("h1")) main.replaceChildren();
  }
}

// Who a signed token names (its `sub`), read from its payload to say who is signed in;
// the server, not this page, checks the signature. `null` for an API key.
function tokenUser(credential) {
  const parts = (credential || "").split(".");
  if (parts.length !== 3) return null;
  try {
    const json = atob(parts[1].replace(/-/g, "+").replace(/_/g, "/"));
    const claims = JSON.parse(json);
    return typeof claims.sub === "string" ? claims.sub : "a token without a user";
  } catch (_) {
    return null;
  }
}

function credentialState(credential) {
  if (!credential) return "";
  const user = tokenUser(credential);
  return user ? `signed in as ${user}` : "key set for this tab";
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = document.getElementById("key").value;
  if (value) sessionStorage.setItem(KEY, value); else sessionStorage.removeItem(KEY);
  document.getElementById("key").value = "";
  document.getElementById("key-state").textContent = value ? credentialState(value) : "no key";
  render();
});
document.getElementById("key-state").textContent = credentialState(sessionStorage.getItem(KEY));
window.addEventListener("hashchange", render);
render();
