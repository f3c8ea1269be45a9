// cyto view: the slide (OpenSeadragon, deep-zoom tiles from this server), every scored cell as a
// marker drawn here once markers are far enough apart to read, the abnormality map at low zoom,
// the top cells, the tissue mask and skipped tiles. Cells arrive once per slide as float32
// quadruples (x, y, score, flag) in rank order: cell i has rank i + 1.
"use strict";

const OSD = window.OpenSeadragon;
// the same colour ramp as cyto.view.folder.ramp (the map's colours)
const STOPS = [[0.19, 0.21, 0.58], [0.20, 0.63, 0.79], [1.0, 0.85, 0.2], [0.85, 0.1, 0.1]];
const BINS = 16;
const READABLE_PX = 6; // markers are drawn once cells lie this many screen px apart
const FLAG_COLOURS = ["rgb(70,110,200)", "rgb(215,25,28)", "rgb(150,150,150)"];
// what each kind of abnormality map (cyto.infer.maps.AbnormalityMap.kind) shows per window
const MAP_WORDS = {
  max_score: "highest score",
  fraction_flagged: "fraction flagged",
  fraction_above_threshold: "fraction above the burden's threshold",
};

const view = {
  viewer: null, info: null, cells: null, n: 0, bins: null, slideItem: null, mapItem: null,
  maskItem: null, selected: null, plane: 0, tileLevels: {}, tileErrors: 0, cellsDrawn: 0,
  readable: false, ready: false,
};
window.cytoView = view; // for tests and the console: the viewer and what was drawn

const $ = (id) => document.getElementById(id);

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: ${r.status} ${(await r.text()).slice(0, 200)}`);
  return r.json();
}

function colour(u) {
  const pos = Math.min(Math.max(u, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(pos), STOPS.length - 2);
  const f = pos - i;
  const c = STOPS[i].map((v, k) => Math.round(255 * (v * (1 - f) + STOPS[i + 1][k] * f)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function binColours() {
  if (view.info.colour_by !== "score") return FLAG_COLOURS;
  return Array.from({ length: BINS }, (_, b) => colour(b / (BINS - 1)));
}

// each cell's colour bin: by flag (0 not flagged, 1 flagged, 2 unknown) or by score
function cellBins() {
  const { cells, n, info } = view;
  const bins = new Uint8Array(n);
  const [lo, hi] = info.score_range || [0, 1];
  const span = hi - lo || 1;
  for (let i = 0; i < n; i++) {
    if (info.colour_by !== "score") {
      const f = cells[4 * i + 3];
      bins[i] = Number.isNaN(f) ? 2 : f > 0 ? 1 : 0;
    } else {
      const u = (cells[4 * i + 2] - lo) / span;
      bins[i] = Math.min(BINS - 1, Math.max(0, Math.round(u * (BINS - 1))));
    }
  }
  return bins;
}

function tileSource(plane) {
  const { info } = view;
  const levels = Math.ceil(Math.log2(Math.max(info.width, info.height) / info.tile_size));
  return {
    width: info.width,
    height: info.height,
    tileSize: info.tile_size,
    tileOverlap: 0,
    minLevel: Math.max(0, info.max_level - Math.max(levels, 0)),
    maxLevel: info.max_level,
    getTileUrl: (level, x, y) =>
      `/tiles/${info.index}/${info.tiles_key}/${plane}/${level}/${x}_${y}.jpeg`,
  };
}

// screen px per level-0 px of the slide
function zoomPx() {
  const item = view.slideItem;
  const a = item.imageToViewerElementCoordinates(new OSD.Point(0, 0));
  const b = item.imageToViewerElementCoordinates(new OSD.Point(1000, 0));
  return (b.x - a.x) / 1000;
}

let pending = false;
function redraw() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    draw();
  });
}

function draw() {
  const t0 = performance.now();
  const canvas = $("cells");
  const stage = $("osd");
  const dpr = window.devicePixelRatio || 1;
  const w = stage.clientWidth;
  const h = stage.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  if (!view.slideItem || !view.cells) return;
  const item = view.slideItem;
  const o = item.imageToViewerElementCoordinates(new OSD.Point(0, 0));
  const z = zoomPx();
  const { info, cells, n, bins } = view;
  // nothing under the navigator (it is translucent): clip its box out
  ctx.save();
  const nav = view.viewer.navigator && view.viewer.navigator.element;
  if (nav && nav.offsetWidth) {
    const a = canvas.getBoundingClientRect();
    const b = nav.getBoundingClientRect();
    ctx.beginPath();
    ctx.rect(0, 0, w, h);
    ctx.rect(b.left - a.left - 2, b.top - a.top - 2, b.width + 4, b.height + 4);
    ctx.clip("evenodd");
  }
  const spacing = Math.sqrt((info.width * info.height * 0.5) / Math.max(n, 1));
  view.readable = spacing * z >= READABLE_PX;
  const showCells = $("show-cells").checked;
  let drawn = 0;
  if (showCells && view.readable) {
    // a dot at the centre: small enough to leave the nucleus around it in view
    const r = Math.max(2.5, Math.min(6, 0.08 * spacing * z));
    const colours = binColours();
    const paths = colours.map(() => new Path2D());
    for (let i = 0; i < n; i++) {
      const sx = o.x + cells[4 * i] * z;
      const sy = o.y + cells[4 * i + 1] * z;
      if (sx < -r || sy < -r || sx > w + r || sy > h + r) continue;
      const p = paths[bins[i]];
      p.moveTo(sx + r, sy);
      p.arc(sx, sy, r, 0, 2 * Math.PI);
      drawn++;
    }
    ctx.globalAlpha = 0.85;
    paths.forEach((p, b) => {
      ctx.fillStyle = colours[b];
      ctx.fill(p);
    });
    ctx.globalAlpha = 1;
    ctx.lineWidth = 1;
    ctx.strokeStyle = "rgba(0,0,0,0.6)";
    paths.forEach((p) => ctx.stroke(p));
  }
  view.cellsDrawn = drawn;
  // the top cells: rings at every zoom, numbered when readable
  if (showCells) {
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#ffffff";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#ffffff";
    for (const c of info.top) {
      const sx = o.x + c.x * z;
      const sy = o.y + c.y * z;
      if (sx < -20 || sy < -20 || sx > w + 20 || sy > h + 20) continue;
      ctx.beginPath();
      ctx.arc(sx, sy, view.readable ? 14 : 5, 0, 2 * Math.PI);
      ctx.stroke();
      if (view.readable) ctx.fillText(String(c.rank), sx + 15, sy - 8);
    }
  }
  ctx.restore();
  const sel = $("selected");
  if (view.selected) {
    const p = item.imageToViewerElementCoordinates(
      new OSD.Point(view.selected.x, view.selected.y));
    sel.style.left = `${p.x}px`;
    sel.style.top = `${p.y}px`;
    sel.hidden = false;
  } else {
    sel.hidden = true;
  }
  if (view.mapItem) {
    const on = $("show-map").checked;
    view.mapItem.setOpacity(on ? (view.readable && showCells ? 0.15 : 0.6) : 0);
  }
  if (view.maskItem) view.maskItem.setOpacity($("show-skipped").checked ? 1 : 0);
  const lvl = Object.keys(view.tileLevels).length;
  $("status").textContent =
    `${(z * 100).toPrecision(3)}% · ${drawn} cells drawn · tiles at ${lvl} level(s)`;
  view.drawMs = performance.now() - t0; // the markers' cost per frame (the benchmark reads it)
}

function row(table, key, value) {
  if (value === null || value === undefined || value === "") return;
  const tr = table.insertRow();
  tr.insertCell().textContent = key;
  tr.insertCell().textContent =
    typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toPrecision(4))
      : Array.isArray(value) ? value.join("; ") : String(value);
}

function showSummary() {
  const { info } = view;
  const s = info.summary;
  const box = $("summary");
  box.replaceChildren();
  const t = document.createElement("table");
  row(t, "slide", info.slide);
  row(t, "size", `${info.width} × ${info.height} px` +
    (info.mpp ? ` at ${info.mpp.toPrecision(3)} µm/px` : ""));
  row(t, "cells scored", s.cells_scored);
  row(t, "model", `${s.model} (${s.method})`);
  row(t, "ranked by", s.rank_by);
  row(t, "mean top-K score", s.slide_score_mean_top_k);
  row(t, "mean top-K morphometric score", s.slide_morphometry_mean_top_k);
  const b = s.burden || {};
  row(t, "burden", b.status);
  // the score the calibration holds, which p-values, flags and burden follow (summary.json's
  // burden.column), and why not the ranking where it differs: sent, not drawn (round 58)
  if (b.column) {
    row(t, "p-values of", b.column === "morphometry_score"
      ? "the morphometric score (morphometry_score)" : `the model's score (${b.column})`);
  }
  row(t, "", b.ranked_otherwise);
  row(t, "triage", b.triage);
  row(t, "slide p-value", b.slide_p_value);
  // the burden's headline numbers only (summary.json holds the rest): the list of top cells
  // below must stay in reach on a 900 px screen
  if (typeof b.abnormal_fraction === "number") {
    const ci = b.abnormal_fraction_interval;
    row(t, "abnormal burden", `${(100 * b.abnormal_fraction).toFixed(1)}%` +
      (Array.isArray(ci) ? ` (95% CI ${(100 * ci[0]).toFixed(1)}-${(100 * ci[1]).toFixed(1)}%)`
        : "") + (typeof b.threshold_quantile_of_normals === "number"
        ? ` of cells above the normal ${+(100 * b.threshold_quantile_of_normals).toFixed(1)}th ` +
          "percentile (a lower bound)" : ""));
  }
  if (typeof b.flagged_bh === "number") row(t, `flagged at FDR ${b.fdr_alpha}`, b.flagged_bh);
  row(t, "", b.reason);
  const a = s.adequacy;
  if (a) {
    row(t, "adequacy", `${a.result}` + (a.preset ? ` (${a.preset})` : ""));
    row(t, "cells evaluable", a.cells_evaluable);
    if (a.reasons && a.reasons.length) row(t, "why", a.reasons);
  }
  if (s.tiles) row(t, "tiles scored", s.tiles.total);
  box.append(t);
  for (const n of info.notes) {
    const p = document.createElement("p");
    p.className = "note";
    p.textContent = n;
    box.append(p);
  }
}

// a number of the table as the list shows it (a withheld value is null)
function num(v) {
  return typeof v === "number" ? v.toPrecision(4) : "n/a";
}

function showTop() {
  const list = $("topk");
  list.replaceChildren();
  for (const c of view.info.top) {
    const li = document.createElement("li");
    li.dataset.rank = c.rank;
    li.dataset.cellId = c.cell_id;
    const rank = document.createElement("span");
    rank.className = "rank";
    rank.textContent = `#${c.rank}`;
    const score = document.createElement("span");
    score.className = "score";
    // the value the rank follows, named (the fused or morphometric score where the cells are
    // ranked by them), and the model's own score beside it
    const by = view.info.ranked_by;
    score.textContent = `${by.label} ${num(c.rank_value)}` +
      (by.column !== "score" ? ` · model score ${num(c.score)}` : "") +
      (c.p_value !== null ? ` · p ${c.p_value.toPrecision(2)}` : "");
    li.append(rank, score);
    if (c.flagged) {
      const f = document.createElement("span");
      f.className = "flag";
      f.textContent = "flagged";
      li.append(f);
    }
    li.addEventListener("click", () => goTo(c));
    list.append(li);
  }
}

function goTo(c) {
  view.selected = c;
  for (const li of $("topk").children) {
    li.classList.toggle("current", Number(li.dataset.rank) === c.rank);
  }
  const vp = view.viewer.viewport;
  const item = view.slideItem;
  vp.panTo(item.imageToViewportCoordinates(c.x, c.y), true);
  // one level-0 pixel to 0.75 screen px: the cell and its surroundings
  vp.zoomTo(item.imageToViewportZoom(0.75), null, true);
  view.viewer.forceRedraw();
  redraw();
}

function showLegend(legend) {
  const { info } = view;
  const ramp = $("ramp").getContext("2d");
  for (let x = 0; x < 200; x++) {
    ramp.fillStyle = colour(x / 199);
    ramp.fillRect(x, 0, 1, 10);
  }
  const words = [];
  if (info.colour_by === "score") {
    const [lo, hi] = info.score_range || [0, 0];
    words.push(`cells: score ${lo.toPrecision(3)} (blue) to ${hi.toPrecision(3)} (red)`);
  } else {
    words.push(`cells: red flagged at the FDR (${info.colour_by}), blue not, grey unknown`);
  }
  if (legend) {
    const what = MAP_WORDS[legend.kind] || legend.kind.replace(/_/g, " ");
    const win = legend.window_um ? `${legend.window_um} µm` : `${legend.window_px} px`;
    const from = legend.kind === "max_score" ? "the median window" : "0";
    words.push(`map: ${what} per ${win} window, from ${from} (${legend.low.toPrecision(3)}) ` +
      `to ${legend.high.toPrecision(3)}; clear: no cell`);
    $("map-kind").textContent = `(${what} per ${win})`;
  }
  $("legend-words").textContent = words.join(" · ");
}

async function loadSlide(index) {
  view.ready = false;
  view.selected = null;
  view.tileLevels = {};
  view.cells = null;
  view.mapItem = view.maskItem = null;
  // asked for at once, used as they come: the tiles need only the slide's size
  const cells = fetch(`/api/slides/${index}/cells.bin`).then((r) => r.arrayBuffer());
  const legend = getJSON(`/api/slides/${index}/map.json`);
  const skipped = getJSON(`/api/slides/${index}/skipped.json`).catch(() => null);
  view.info = await getJSON(`/api/slides/${index}`);
  const info = view.info;
  const planes = $("plane");
  planes.replaceChildren();
  for (const p of info.planes) {
    const o = document.createElement("option");
    o.value = p.index;
    o.textContent = `${p.z_um >= 0 ? "+" : ""}${p.z_um} µm`;
    planes.append(o);
  }
  $("plane-row").hidden = info.planes.length < 2;
  view.plane = 0;
  showSummary();
  showTop();
  if (view.viewer) {
    $("stage").append($("cells"), $("selected")); // out of the viewer's DOM before it goes
    view.viewer.destroy();
  }
  const viewer = OSD({
    element: $("osd"),
    prefixUrl: "/static/vendor/openseadragon/images/",
    tileSources: tileSource(0),
    drawer: "canvas",
    showNavigator: true,
    navigatorPosition: "TOP_RIGHT",
    maxZoomPixelRatio: 4,
    visibilityRatio: 0.1, // a cell at the slide's edge can still be centred
    gestureSettingsMouse: { clickToZoom: false },
    immediateRender: true, // the home view's own level first: fewer tiles before it is sharp
    imageSmoothingEnabled: true,
  });
  view.viewer = viewer;
  // the markers in the viewer's drawing area: under its buttons and navigator, not over them
  viewer.canvas.append($("cells"), $("selected"));
  viewer.addHandler("tile-loaded", (e) => {
    if (e.tiledImage === view.slideItem) {
      view.tileLevels[e.tile.level] = (view.tileLevels[e.tile.level] || 0) + 1;
    }
  });
  viewer.addHandler("tile-load-failed", () => { view.tileErrors++; });
  viewer.addHandler("update-viewport", redraw);
  viewer.addHandler("resize", redraw);
  viewer.addHandler("open", async () => {
    view.slideItem = viewer.world.getItemAt(0);
    const [buffer, map] = await Promise.all([cells, legend]);
    view.cells = new Float32Array(buffer);
    view.n = view.cells.length / 4;
    view.bins = cellBins();
    showLegend(map);
    viewer.addTiledImage({
      tileSource: { type: "image", url: `/api/slides/${index}/map.png`, buildPyramid: false },
      x: 0, y: 0, width: (map.cols * map.window_px) / info.width, opacity: 0,
      success: (e) => { view.mapItem = e.item; redraw(); },
    });
    view.ready = true;
    redraw();
    view.skipped = await skipped;
    if (view.skipped && view.skipped.mask_downsample) {
      viewer.addTiledImage({
        tileSource: { type: "image", url: `/api/slides/${index}/mask.png`, buildPyramid: false },
        x: 0, y: 0, width: 1, opacity: 0,
        success: (e) => { view.maskItem = e.item; redraw(); },
      });
    }
  });
}

function setPlane(plane) {
  view.plane = plane;
  view.tileLevels = {};
  view.viewer.addTiledImage({
    tileSource: tileSource(plane), index: 0, replace: true,
    success: (e) => { view.slideItem = e.item; redraw(); },
  });
}

async function main() {
  const { slides } = await getJSON("/api/slides");
  const select = $("slide");
  for (const s of slides) {
    const o = document.createElement("option");
    o.value = s.index;
    o.textContent = `${s.name} (${s.cells} cells)`;
    select.append(o);
  }
  select.hidden = slides.length < 2;
  select.addEventListener("change", () => loadSlide(Number(select.value)));
  $("plane").addEventListener("change", (e) => setPlane(Number(e.target.value)));
  for (const id of ["show-cells", "show-map", "show-skipped"]) {
    $(id).addEventListener("change", redraw);
  }
  window.addEventListener("resize", redraw);
  if (slides.length) await loadSlide(0);
}

view.goTo = goTo;
view.setPlane = setPlane;
main().catch((e) => { $("status").textContent = `error: ${e.message}`; });
