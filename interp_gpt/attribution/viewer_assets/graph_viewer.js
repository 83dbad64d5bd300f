/* The attribution graph page (interp_gpt.attribution.viewer): prune live, draw, show a node, pin, group.
   Every string from the data reaches the page as text (textContent, setAttribute), never as markup. */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("graph-data").textContent);
  const NODES = DATA.nodes, N = NODES.length, SVG_NS = "http://www.w3.org/2000/svg";
  const BY_ID = new Map(NODES.map((n, i) => [n.id, i]));
  const ALWAYS = NODES.map((n) => n.kind === "embedding" || n.kind === "logit");
  // Influences are float32 numbers in the data: compare them as float32, as prune_graph does.
  const INFL = NODES.map((n) => Math.fround(n.influence)), CUM = NODES.map((n) => Math.fround(n.cumulative));
  const LOGIT_W = new Float64Array(NODES.map((n) => (n.kind === "logit" ? Math.fround(n.prob) : 0)));
  // prune_graph's rank: by influence, most first (ties in the cumulative share: the larger influence first)
  const RANK = NODES.map((_, i) => i).sort((a, b) => CUM[a] - CUM[b] || INFL[b] - INFL[a]);

  const E = DATA.edges.length / 3;
  const SRC = new Int32Array(E), TGT = new Int32Array(E), W = new Float64Array(E), ABS = new Float64Array(E);
  const IN = NODES.map(() => []), OUT = NODES.map(() => []);
  for (let e = 0; e < E; e++) {
    SRC[e] = DATA.edges[3 * e];
    TGT[e] = DATA.edges[3 * e + 1];
    W[e] = Math.fround(DATA.edges[3 * e + 2]);
    ABS[e] = Math.abs(W[e]);
    OUT[SRC[e]].push(e);
    IN[TGT[e]].push(e);
  }

  /* prune_graph (interp_gpt/attribution/prune.py), step by step, on the nodes and edges the page holds. */
  function prune(nodeThreshold, edgeThreshold) {
    const nt = Math.fround(nodeThreshold), et = Math.fround(edgeThreshold);
    // 1. the node mask: influence at least that of the node where the cumulative share reaches nt
    let cut = INFL[RANK[RANK.length - 1]];
    for (const i of RANK) {
      if (CUM[i] >= nt) { cut = INFL[i]; break; }
    }
    let node = new Uint8Array(N);
    for (let i = 0; i < N; i++) node[i] = ALWAYS[i] || INFL[i] >= cut ? 1 : 0;
    // 2. the kept nodes' adjacency, |weights| normalised per target
    const rowSum = new Float64Array(N), norm = new Float64Array(E);
    for (let e = 0; e < E; e++) if (node[SRC[e]] && node[TGT[e]]) rowSum[TGT[e]] += ABS[e];
    for (let e = 0; e < E; e++) if (node[SRC[e]] && node[TGT[e]]) norm[e] = ABS[e] / Math.max(rowSum[TGT[e]], 1e-10);
    // 3. each node's influence on the logits through them (w A + w A^2 + ...), plus its own logit weight
    const target = Float64Array.from(LOGIT_W);
    let current = Float64Array.from(LOGIT_W);
    for (let step = 0; step <= N; step++) {
      const next = new Float64Array(N);
      let any = false;
      for (let e = 0; e < E; e++) {
        if (norm[e] && current[TGT[e]]) { next[SRC[e]] += current[TGT[e]] * norm[e]; any = true; }
      }
      if (!any) break;
      for (let i = 0; i < N; i++) target[i] += next[i];
      current = next;
    }
    // 4. the edge mask: score = normalised weight x the target's influence, cumulative share up to et
    const score = new Float64Array(E);
    for (let e = 0; e < E; e++) score[e] = norm[e] * target[TGT[e]];
    const ordered = Array.from(score).filter((s) => s > 0).sort((a, b) => b - a);
    const total = Math.fround(ordered.reduce((a, b) => a + b, 0));
    let ecut = ordered.length ? ordered[ordered.length - 1] : Infinity, run = 0;
    for (const s of ordered) {
      run += s;
      if (Math.fround(Math.fround(run) / total) >= et) { ecut = s; break; }
    }
    const edge = new Uint8Array(E);
    for (let e = 0; e < E; e++) edge[e] = score[e] > 0 && score[e] >= ecut ? 1 : 0;
    // 5. clean-up: features and errors need a kept output, features a kept input, until nothing changes
    for (;;) {
      const hasOut = new Uint8Array(N), hasIn = new Uint8Array(N);
      for (let e = 0; e < E; e++) if (edge[e]) { hasOut[SRC[e]] = 1; hasIn[TGT[e]] = 1; }
      const after = node.slice();
      for (let i = 0; i < N; i++) {
        if (!ALWAYS[i] && !hasOut[i]) after[i] = 0;
        if (NODES[i].kind === "feature" && !hasIn[i]) after[i] = 0;
      }
      if (after.every((v, i) => v === node[i])) break;
      node = after;
      for (let e = 0; e < E; e++) if (edge[e] && !(node[SRC[e]] && node[TGT[e]])) edge[e] = 0;
    }
    return { node, edge };
  }

  // ----- the page's state ---------------------------------------------------------------------
  const state = {
    nt: DATA.node_threshold, et: DATA.edge_threshold, kept: null, clicked: -1, hovered: -1,
    pinned: [], supernodes: [], drawnOnce: false,
  };
  const $ = (id) => document.getElementById(id);
  const visible = (s) => String(s).replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");
  const fmt = (x) => (x === undefined || x === null ? "" : Math.abs(x) >= 1e-3 || x === 0 ? x.toFixed(4) : x.toExponential(3));
  const PALETTE = ["#2f9e44", "#ae3ec9", "#e8590c", "#1971c2", "#c2255c", "#5c940d", "#0c8599", "#862e9c"];

  function el(tag, attrs, text, ns) {
    const e = ns ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const svgEl = (tag, attrs, text) => el(tag, attrs, text, true);
  function nodeName(i) {
    const n = NODES[i];
    if (n.kind === "logit") return `logit ${visible(n.token)} (p=${n.prob.toFixed(3)})`;
    if (n.kind === "embedding") return `emb ${visible(n.token)} @${n.pos}`;
    return `${n.label} @${n.pos} ${visible(DATA.tokens[n.pos])}`;
  }
  const clip = (s, n) => (s.length > n ? s.slice(0, Math.max(1, n - 1)) + "\u2026" : s);

  // ----- layout and drawing ----------------------------------------------------------------------
  const ROW_H = 90, SLOT = 16, MIN_COL = 56, LEFT = 70, TOP = 70, BOTTOM = 60;
  const rowOf = (n) => (n.kind === "embedding" ? 0 : n.kind === "logit" ? DATA.n_layers + 1 : n.layer + 1);
  const N_ROWS = DATA.n_layers + 2;

  function layout(shown) {
    const cells = new Map();
    for (const i of shown) {
      const key = rowOf(NODES[i]) * DATA.n_pos + NODES[i].pos;
      if (!cells.has(key)) cells.set(key, []);
      cells.get(key).push(i);
    }
    const width = new Array(DATA.n_pos).fill(MIN_COL);
    for (const [key, list] of cells) {
      const pos = key % DATA.n_pos;
      list.sort((a, b) => (NODES[a].kind === "error") - (NODES[b].kind === "error") || CUM[a] - CUM[b]);
      width[pos] = Math.max(width[pos], list.length * SLOT + 12);
    }
    const x0 = [LEFT];
    for (let p = 0; p < DATA.n_pos; p++) x0.push(x0[p] + width[p]);
    const xy = new Map();
    for (const [key, list] of cells) {
      const row = Math.floor(key / DATA.n_pos), pos = key % DATA.n_pos;
      list.forEach((i, k) => {
        xy.set(i, [x0[pos] + width[pos] / 2 + (k - (list.length - 1) / 2) * SLOT, TOP + (N_ROWS - 1 - row) * ROW_H]);
      });
    }
    return { xy, x0, width, total: x0[DATA.n_pos] + 20, height: TOP + (N_ROWS - 1) * ROW_H + BOTTOM };
  }

  function drawNode(i, x, y) {
    const n = NODES[i];
    const g = svgEl("g", { class: `node kind-${n.kind}`, "data-id": n.id, "data-index": i, transform: `translate(${x},${y})` });
    if (n.kind === "feature") g.appendChild(svgEl("circle", { r: 6 }));
    else if (n.kind === "error") g.appendChild(svgEl("rect", { x: -5, y: -5, width: 10, height: 10 }));
    else g.appendChild(svgEl("rect", { x: -7, y: -6, width: 14, height: 12, rx: 3 }));
    if (n.kind === "logit") g.appendChild(svgEl("text", { class: "logit-label", x: 0, y: -12, transform: "rotate(-35 0 -12)" }, visible(n.token)));
    g.appendChild(svgEl("title", {}, nodeName(i)));
    if (state.pinned.includes(n.id)) g.classList.add("pinned");
    return g;
  }

  function render() {
    state.kept = prune(state.nt, state.et);
    const { node, edge } = state.kept;
    const shown = [];
    for (let i = 0; i < N; i++) if (node[i]) shown.push(i);
    const L = layout(shown);
    const svg = $("graph");
    // The page opens at the logit end (the last positions, where the logits and most kept nodes sit); a
    // redraw keeps the reader's scroll: at the logit end it stays there, elsewhere it keeps its place.
    const wrap = $("graph-wrap");
    const left = wrap.scrollLeft, atEnd = !state.drawnOnce || left + wrap.clientWidth >= wrap.scrollWidth - 2;
    svg.replaceChildren();
    svg.setAttribute("width", L.total);
    svg.setAttribute("height", L.height);
    svg.setAttribute("viewBox", `0 0 ${L.total} ${L.height}`);
    const axes = svgEl("g", { class: "axes" });
    const rowNames = ["emb"].concat(Array.from({ length: DATA.n_layers }, (_, l) => `L${l}`), ["logits"]);
    rowNames.forEach((name, row) => axes.appendChild(svgEl("text", { class: "row-label", x: 8, y: TOP + (N_ROWS - 1 - row) * ROW_H + 4 }, name)));
    for (let p = 0; p < DATA.n_pos; p++) {
      const t = svgEl("text", { class: "token-label", "data-pos": p, x: L.x0[p] + L.width[p] / 2, y: L.height - BOTTOM + 34 }, clip(visible(DATA.tokens[p]), Math.floor(L.width[p] / 7)));
      t.appendChild(svgEl("title", {}, `position ${p}: ${JSON.stringify(DATA.tokens[p])}`));
      axes.appendChild(t);
      if (p) axes.appendChild(svgEl("line", { class: "col-rule", x1: L.x0[p], x2: L.x0[p], y1: TOP - 30, y2: L.height - BOTTOM + 18 }));
    }
    svg.appendChild(axes);
    const keptEdges = [];
    let top = 0;
    for (let e = 0; e < E; e++) if (edge[e]) { keptEdges.push(e); top = Math.max(top, ABS[e]); }
    keptEdges.sort((a, b) => ABS[a] - ABS[b]);
    const edges = svgEl("g", { class: "edges" });
    for (const e of keptEdges) {
      const [x1, y1] = L.xy.get(SRC[e]), [x2, y2] = L.xy.get(TGT[e]), ym = (y1 + y2) / 2;
      edges.appendChild(svgEl("path", {
        class: `edge ${W[e] >= 0 ? "pos" : "neg"}`, "data-source": NODES[SRC[e]].id, "data-target": NODES[TGT[e]].id,
        d: `M${x1},${y1} C${x1},${ym} ${x2},${ym} ${x2},${y2}`, "stroke-width": (0.4 + 4.6 * ABS[e] / (top || 1)).toFixed(2),
      }));
    }
    svg.appendChild(edges);
    const groups = svgEl("g", { class: "supernodes" });
    state.supernodes.forEach((s, k) => {
      const pts = s.members.map((id) => L.xy.get(BY_ID.get(id))).filter(Boolean);
      if (!pts.length) return;
      const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
      const x = Math.min(...xs) - 11, y = Math.min(...ys) - 11;
      const colour = PALETTE[k % PALETTE.length];
      const g = svgEl("g", { class: "supernode", "data-name": s.name });
      g.appendChild(svgEl("rect", { x, y, width: Math.max(...xs) - x + 11, height: Math.max(...ys) - y + 11, rx: 8, stroke: colour }));
      g.appendChild(svgEl("text", { x, y: y - 4, fill: colour }, s.name));
      groups.appendChild(g);
    });
    svg.appendChild(groups);
    const nodes = svgEl("g", { class: "nodes" });
    for (const i of shown) nodes.appendChild(drawNode(i, ...L.xy.get(i)));
    svg.appendChild(nodes);
    wrap.scrollLeft = atEnd ? wrap.scrollWidth - wrap.clientWidth : left;
    state.drawnOnce = true;
    $("counts").textContent = `${shown.length} of ${N} nodes, ${keptEdges.length} of ${E} edges drawn`;
    $("node-threshold-value").textContent = state.nt.toFixed(3);
    $("edge-threshold-value").textContent = state.et.toFixed(3);
    focus(state.hovered >= 0 ? state.hovered : state.clicked);
  }

  // ----- a node's details ----------------------------------------------------------------------------
  function focus(i) {
    const svg = $("graph");
    svg.classList.toggle("focus", i >= 0);
    for (const e of svg.querySelectorAll(".hi")) e.classList.remove("hi");
    if (i < 0) return;
    const id = NODES[i].id;
    for (const e of svg.querySelectorAll(".edge")) {
      if (e.getAttribute("data-source") === id || e.getAttribute("data-target") === id) e.classList.add("hi");
    }
    for (const g of svg.querySelectorAll(".node")) if (g.getAttribute("data-id") === id) g.classList.add("hi");
  }

  function edgeList(title, list, other) {
    const box = el("div", { class: "edge-list" });
    box.appendChild(el("h4", {}, title));
    const ul = el("ul");
    const ranked = list.slice().sort((a, b) => ABS[b] - ABS[a]).slice(0, 8);
    for (const e of ranked) {
      const j = other(e);
      const li = el("li", { class: state.kept && state.kept.edge[e] ? "kept" : "pruned", "data-id": NODES[j].id });
      li.appendChild(el("span", { class: W[e] >= 0 ? "w pos" : "w neg" }, (W[e] >= 0 ? "+" : "") + fmt(W[e])));
      li.appendChild(el("span", { class: "link" }, ` ${nodeName(j)}`));
      li.addEventListener("click", () => { state.clicked = j; showDetails(j); render(); });
      ul.appendChild(li);
    }
    if (!ranked.length) ul.appendChild(el("li", { class: "none" }, "none"));
    box.appendChild(ul);
    return box;
  }

  function tokenTable(title, rows) {
    const box = el("div", { class: "tokens" });
    box.appendChild(el("h4", {}, title));
    const ul = el("ul");
    for (const [tok, v] of rows) {
      const li = el("li");
      li.appendChild(el("span", { class: "tok" }, visible(tok)));
      li.appendChild(el("span", { class: "w" }, ` ${fmt(v)}`));
      ul.appendChild(li);
    }
    box.appendChild(ul);
    return box;
  }

  function contextBlock(contexts) {
    const box = el("div", { class: "contexts" });
    box.appendChild(el("h4", {}, "top-activating contexts"));
    const vmax = Math.max(...contexts.map((c) => c.max), 1e-9);
    for (const c of contexts) {
      const row = el("div", { class: "ctx" });
      row.appendChild(el("span", { class: "act" }, fmt(c.max)));
      c.tokens.forEach((tok, k) => {
        const a = Math.max(0, Math.min(1, c.acts[k] / vmax));
        const span = el("span", { class: k === c.pos ? "tok top" : "tok", title: `${JSON.stringify(tok)}: ${fmt(c.acts[k])}` }, visible(tok));
        span.style.background = `rgba(217,72,15,${a.toFixed(3)})`;
        row.appendChild(span);
      });
      box.appendChild(row);
    }
    if (!contexts.length) box.appendChild(el("p", { class: "hint" }, "never fires on the contexts given"));
    return box;
  }

  function showDetails(i) {
    const box = $("details");
    box.replaceChildren();
    if (i < 0) { box.appendChild(el("p", { class: "hint" }, "Hover a node; click to pin it.")); return; }
    const n = NODES[i];
    box.appendChild(el("h3", { class: `kind-${n.kind}` }, nodeName(i)));
    const rows = [["kind", n.kind], ["layer", n.kind === "embedding" ? "embedding" : n.kind === "logit" ? "logits" : n.layer],
      ["position", `${n.pos} (${visible(DATA.tokens[n.pos])})`]];
    if (n.kind === "feature") rows.push(["feature", n.feature], ["activation", fmt(n.activation)]);
    if (n.kind === "logit") rows.push(["token", visible(n.token)], ["probability", fmt(n.prob)]);
    rows.push(["influence", fmt(n.influence)], ["cumulative influence", fmt(n.cumulative)]);
    rows.push(["drawn", state.kept && state.kept.node[i] ? "yes" : "no (pruned)"]);
    const table = el("table", { class: "fields" });
    for (const [k, v] of rows) {
      const tr = el("tr", { "data-field": k });
      tr.appendChild(el("th", {}, k));
      tr.appendChild(el("td", {}, v));
      table.appendChild(tr);
    }
    box.appendChild(table);
    box.appendChild(edgeList("strongest inputs", IN[i], (e) => SRC[e]));
    box.appendChild(edgeList("strongest outputs", OUT[i], (e) => TGT[e]));
    if (n.promoted) {
      box.appendChild(tokenTable("promotes", n.promoted));
      box.appendChild(tokenTable("suppresses", n.suppressed));
    }
    if (n.contexts) box.appendChild(contextBlock(n.contexts));
  }

  // ----- pins and supernodes, kept in localStorage under the slug ------------------------------------
  const KEY = `interp_gpt.attribution_graph.${DATA.slug}`;
  function grouping() {
    return { schema: 1, slug: DATA.slug, pinned: state.pinned.slice(), supernodes: state.supernodes.map((s) => ({ name: s.name, members: s.members.slice() })) };
  }
  function save() {
    try { localStorage.setItem(KEY, JSON.stringify(grouping())); } catch (err) { status(`not saved in this browser: ${err}`); }
  }
  function status(text) { $("grouping-status").textContent = text; }

  /* A grouping read from storage or a file: only strings, only this graph's node ids. */
  function applyGrouping(obj) {
    if (!obj || typeof obj !== "object" || !Array.isArray(obj.supernodes)) throw new Error("expected {\"supernodes\": [...]}");
    let dropped = 0;
    const known = (ids) => (Array.isArray(ids) ? ids : []).filter((id) => (typeof id === "string" && BY_ID.has(id)) || (dropped++, false));
    const supernodes = [];
    for (const s of obj.supernodes) {
      if (!s || typeof s.name !== "string") throw new Error("every supernode needs a name (a string)");
      const members = [...new Set(known(s.members))];
      if (members.length) supernodes.push({ name: s.name.slice(0, 80), members });
    }
    state.supernodes = supernodes;
    state.pinned = [...new Set(known(obj.pinned))];
    return dropped;
  }
  function load() {
    let text = null;
    try { text = localStorage.getItem(KEY); } catch (err) { return; }
    if (!text) return;
    try { applyGrouping(JSON.parse(text)); } catch (err) { status(`saved grouping ignored: ${err.message}`); }
  }

  function renderLists() {
    const ul = $("pinned");
    ul.replaceChildren();
    for (const id of state.pinned) {
      const i = BY_ID.get(id);
      const li = el("li", { "data-id": id });
      li.appendChild(el("span", { class: "link" }, nodeName(i)));
      li.firstChild.addEventListener("click", () => { state.clicked = i; showDetails(i); focus(i); });
      const x = el("button", { type: "button", class: "unpin", title: "unpin" }, "\u00d7");
      x.addEventListener("click", () => togglePin(i));
      li.appendChild(x);
      ul.appendChild(li);
    }
    const sl = $("supernodes");
    sl.replaceChildren();
    state.supernodes.forEach((s, k) => {
      const li = el("li", { "data-name": s.name });
      li.appendChild(el("span", { class: "swatch", style: `background:${PALETTE[k % PALETTE.length]}` }));
      li.appendChild(el("span", { class: "name" }, s.name));
      li.appendChild(el("span", { class: "members" }, ` (${s.members.length}: ${s.members.map((id) => nodeName(BY_ID.get(id))).join(", ")})`));
      const x = el("button", { type: "button", class: "ungroup", title: "remove" }, "\u00d7");
      x.addEventListener("click", () => { state.supernodes.splice(k, 1); changed(); });
      li.appendChild(x);
      sl.appendChild(li);
    });
  }
  function changed() { save(); renderLists(); render(); }
  function togglePin(i) {
    const id = NODES[i].id, at = state.pinned.indexOf(id);
    if (at >= 0) state.pinned.splice(at, 1); else state.pinned.push(id);
    changed();
  }
  function group(name) {
    if (!state.pinned.length) { status("pin the nodes to group first (click them)"); return false; }
    const taken = new Set(state.supernodes.map((s) => s.name));
    let label = String(name || "").trim().slice(0, 80) || `group ${state.supernodes.length + 1}`;
    for (let k = 2; taken.has(label); k++) label = `${String(name || "group").trim().slice(0, 70)} (${k})`;
    state.supernodes.push({ name: label, members: state.pinned.slice() });
    state.pinned = [];
    status(`grouped as ${JSON.stringify(label)}`);
    changed();
    return true;
  }
  function importGrouping(text) {
    try {
      const dropped = applyGrouping(JSON.parse(text));
      status(`loaded ${state.supernodes.length} supernodes` + (dropped ? `; ${dropped} node ids not in this graph left out` : ""));
      changed();
      return true;
    } catch (err) {
      status(`not a grouping file: ${err.message}`);
      return false;
    }
  }

  // ----- wiring ---------------------------------------------------------------------------------------
  const svg = $("graph");
  const nodeAt = (target) => { const g = target.closest && target.closest(".node"); return g ? Number(g.getAttribute("data-index")) : -1; };
  svg.addEventListener("mouseover", (ev) => {
    const i = nodeAt(ev.target);
    if (i >= 0 && i !== state.hovered) { state.hovered = i; showDetails(i); focus(i); }
  });
  svg.addEventListener("mouseout", (ev) => {
    if (nodeAt(ev.target) >= 0 && nodeAt(ev.relatedTarget || svg) < 0) {
      state.hovered = -1; showDetails(state.clicked); focus(state.clicked);
    }
  });
  svg.addEventListener("click", (ev) => {
    const i = nodeAt(ev.target);
    if (i < 0) return;
    state.clicked = i;
    togglePin(i);
    showDetails(i);
  });
  for (const [id, key] of [["node-threshold", "nt"], ["edge-threshold", "et"]]) {
    $(id).addEventListener("input", (ev) => { state[key] = parseFloat(ev.target.value); render(); if (state.clicked >= 0 || state.hovered >= 0) showDetails(state.hovered >= 0 ? state.hovered : state.clicked); });
  }
  $("group").addEventListener("click", () => { if (group($("group-name").value)) $("group-name").value = ""; });
  $("clear-pins").addEventListener("click", () => { state.pinned = []; changed(); });
  $("download").addEventListener("click", () => {
    const url = URL.createObjectURL(new Blob([JSON.stringify(grouping(), null, 2)], { type: "application/json" }));
    const a = el("a", { href: url, download: `${DATA.slug}-supernodes.json` });
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  $("upload").addEventListener("change", (ev) => {
    const file = ev.target.files && ev.target.files[0];
    if (!file) return;
    const reader = new FileReader();
    reader.onload = () => importGrouping(String(reader.result));
    reader.onerror = () => status(`could not read ${file.name}`);
    reader.readAsText(file);
  });

  $("title").textContent = DATA.title;
  $("prompt").textContent = DATA.prompt;
  $("summary").textContent = `${DATA.slug}: ${N} of the graph's ${DATA.n_graph_nodes} nodes and ${E} of its ${DATA.n_graph_edges} edges held here` +
    (DATA.max_nodes_cut ? ` (the node slider stops at ${DATA.node_max}: max_nodes)` : ` (every node within ${DATA.node_max} of the influence)`);
  $("legend").textContent = "rows: embeddings, layers, logits; columns: token positions. circles: features, grey squares: error nodes. orange edges: positive, blue: negative; width: |weight|.";
  load();
  renderLists();
  render();

  window.attributionGraph = {
    data: DATA,
    prune(nt, et) {
      const { node, edge } = prune(nt, et);
      return { nodes: NODES.filter((_, i) => node[i]).map((n) => n.id), edges: Array.from({ length: E }, (_, e) => e).filter((e) => edge[e]).map((e) => [NODES[SRC[e]].id, NODES[TGT[e]].id]) };
    },
    drawn() { return this.prune(state.nt, state.et); },
    thresholds: () => [state.nt, state.et],
    grouping,
    group,
    importGrouping,
  };
})();
