// cyto review: one reviewer's page. Every mark is POSTed at once and the grid shows what the
// server stored (the server's answer, not the click, sets the cell's state).
"use strict";

const token = document.querySelector('meta[name="cyto-token"]').content;
const KEYS_DETAIL = { "1": "malignant", "2": "atypical", "3": "artifact" };
const SHORT = { malignant: "M", atypical: "A", artifact: "X" };
let session = null;   // {reviewer, cols, cases: [{case, n, marked, done}]}
let index = 0;        // current case in the reviewer's order
let state = null;     // {case, n, cols, marks: {pos: {marked, detail}}, done}
let cursor = 0;

const $ = (id) => document.getElementById(id);

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Cyto-Token": token },
    body: JSON.stringify(body),
  };
  const res = await fetch(path, { cache: "no-store", ...opts });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
  return data;
}

function saved(text, isError) {
  const el = $("saved");
  el.textContent = text;
  el.classList.toggle("error", !!isError);
}

let cols = 10;         // columns shown: as many as keep a cell at least its crop's size

function fitColumns() {
  if (!session) return;
  const grid = $("grid");
  const gap = 4, width = grid.clientWidth || document.documentElement.clientWidth - 28;
  const crop = (state && state.crop_px) || 192;
  cols = Math.max(4, Math.min(session.cols, Math.floor((width + gap) / (crop + gap))));
  document.documentElement.style.setProperty("--cols", cols);
}

async function start() {
  session = await api("/api/session");
  $("grid").classList.add("centre");
  fitColumns();
  // continue where this reviewer left off: the first case not done yet
  const open = session.cases.findIndex((c) => !c.done);
  await openCase(open < 0 ? 0 : open);
}

async function openCase(i) {
  if (!session.cases.length) { $("case-title").textContent = "no cases"; return; }
  index = Math.max(0, Math.min(session.cases.length - 1, i));
  state = await api(`/api/cases/${encodeURIComponent(session.cases[index].case)}`);
  cursor = Math.min(cursor, state.n - 1);
  fitColumns();
  render();
}

function render() {
  const grid = $("grid");
  grid.replaceChildren();
  for (let p = 0; p < state.n; p++) {
    const cell = document.createElement("div");
    cell.className = "cell";
    cell.dataset.pos = p;
    cell.setAttribute("role", "gridcell");
    const img = document.createElement("img");
    img.src = `/crops/${encodeURIComponent(state.case)}/${p}.png`;
    img.alt = `cell ${p + 1}`;
    img.draggable = false;
    const zoom = document.createElement("button");
    zoom.className = "zoom";
    zoom.title = "larger view from the slide (c)";
    zoom.textContent = "\u2922";
    zoom.addEventListener("click", (e) => { e.stopPropagation(); cursor = p; showContext(); });
    cell.append(img, zoom);
    cell.addEventListener("click", () => { cursor = p; toggle(p); });
    grid.append(cell);
  }
  paint();
}

function paint() {
  const c = session.cases[index];
  const marked = Object.keys(state.marks).length;
  c.marked = marked;
  c.done = state.done;
  $("case-title").textContent = `case ${index + 1} of ${session.cases.length}: ${state.case}`;
  $("case-progress").textContent = `${marked} of ${state.n} marked`;
  const nDone = session.cases.filter((x) => x.done).length;
  $("overall-progress").textContent = `${nDone}/${session.cases.length} cases done`;
  const done = $("done");
  done.classList.toggle("is-done", state.done);
  done.textContent = state.done ? "Done \u2713 (d: reopen)" : "Done with this case";
  for (const cell of $("grid").children) {
    const p = Number(cell.dataset.pos);
    const m = state.marks[p];
    cell.classList.toggle("marked", !!m);
    cell.classList.toggle("cursor", p === cursor);
    cell.setAttribute("aria-selected", m ? "true" : "false");
    let badge = cell.querySelector(".detail");
    if (m && m.detail) {
      if (!badge) { badge = document.createElement("span"); badge.className = "detail"; cell.append(badge); }
      badge.textContent = SHORT[m.detail] || m.detail;
      badge.title = m.detail;
    } else if (badge) {
      badge.remove();
    }
  }
}

// Writes go one after another, and each body is made when its turn comes (from the state the
// server last returned), so fast key presses never race or act on a stale grid.
let queue = Promise.resolve();

function send(path, makeBody) {
  saved("saving\u2026");
  queue = queue.then(async () => {
    try {
      state = await api(path, makeBody());
      saved("saved");
    } catch (err) {
      saved(`not saved: ${err.message}`, true);
    }
    paint();
  });
  return queue;
}

function toggle(p) {
  return send("/api/mark", () => ({ case: state.case, position: p, marked: !state.marks[p], detail: "" }));
}

function label(p, detail) {
  return send("/api/mark", () => ({ case: state.case, position: p, marked: true, detail }));
}

function clear(p) {
  return send("/api/mark", () => ({ case: state.case, position: p, marked: false, detail: "" }));
}

function setDone() {
  return send("/api/done", () => ({ case: state.case, done: !state.done }));
}

function go(step) {  // the step is applied when its turn comes: n n moves two cases
  queue = queue.then(() => openCase(index + step)).catch((err) => saved(err.message, true));
  return queue;
}

function showContext() {
  const box = $("context");
  $("cell-img").src = `/crops/${encodeURIComponent(state.case)}/${cursor}.png`;
  $("context-img").src = `/context/${encodeURIComponent(state.case)}/${cursor}.png`;
  $("context-caption").textContent = `cell ${cursor + 1} at 1:1, and its surroundings from the ` +
    "slide: the yellow box is the cell (Esc closes)";
  box.hidden = false;
}

function move(dx, dy) {
  let p = cursor + dx + dy * cols;
  if (p < 0 || p >= state.n) return;
  cursor = p;
  paint();
}

document.addEventListener("keydown", (e) => {
  if (!state || e.ctrlKey || e.metaKey || e.altKey) return;
  const box = $("context");
  if (!box.hidden) {
    if (e.key === "Escape" || e.key === "c") { box.hidden = true; e.preventDefault(); }
    return;
  }
  const k = e.key;
  if (k === "ArrowLeft" || k === "h") move(-1, 0);
  else if (k === "ArrowRight" || k === "l") move(1, 0);
  else if (k === "ArrowUp" || k === "k") move(0, -1);
  else if (k === "ArrowDown" || k === "j") move(0, 1);
  else if (k === " " || k === "Enter") toggle(cursor);
  else if (k in KEYS_DETAIL) label(cursor, KEYS_DETAIL[k]);
  else if (k === "0" || k === "Backspace" || k === "Delete") clear(cursor);
  else if (k === "c") showContext();
  else if (k === "x") $("grid").classList.toggle("centre");
  else if (k === "d") setDone();
  else if (k === "n" || k === "PageDown") go(1);
  else if (k === "p" || k === "PageUp") go(-1);
  else return;
  e.preventDefault();
});

$("context").addEventListener("click", () => { $("context").hidden = true; });
for (const [id, action] of [["prev", () => go(-1)], ["next", () => go(1)], ["done", setDone]]) {
  // blur: a focused header button would otherwise also take the next Space press
  $(id).addEventListener("click", (e) => { e.currentTarget.blur(); action(); });
}
window.addEventListener("resize", fitColumns);
start().catch((err) => saved(`cannot load the review: ${err.message}`, true));
