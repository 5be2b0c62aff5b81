// Small SVG charts drawn with plain DOM calls: a line chart, stacked bars, block lanes and a
// star graph of peers. Labels are set as text nodes, never parsed as markup.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const PAD = { left: 44, right: 10, top: 10, bottom: 22 };

export function svg(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function canvas(width, height, label) {
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": label });
  root.appendChild(svg("title", {}, label));
  return root;
}

// a round upper bound for an axis: 1, 2 or 5 times a power of ten
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

export function formatNumber(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 100) return String(Math.round(value));
  if (Math.abs(value) >= 10) return value.toFixed(1);
  return value.toFixed(2).replace(/\.?0+$/, "") || "0";
}

function axes(root, box, yMax, xLabels, yFormat) {
  const { x0, x1, y0, y1 } = box;
  for (const [value, y] of [[0, y0], [yMax / 2, (y0 + y1) / 2], [yMax, y1]]) {
    root.appendChild(svg("line", { x1: x0, x2: x1, y1: y, y2: y, class: "grid" }));
    root.appendChild(svg("text", { x: x0 - 6, y: y + 4, class: "tick", "text-anchor": "end" },
      yFormat(value)));
  }
  const [left, right] = xLabels;
  root.appendChild(svg("text", { x: x0, y: y0 + 16, class: "tick" }, left));
  root.appendChild(svg("text", { x: x1, y: y0 + 16, class: "tick", "text-anchor": "end" }, right));
}

// series: [{name, cls, points: [[x, y], ...]}] (null y values break the line)
export function lineChart({ title, series, width = 520, height = 170, xLabels = ["", ""],
  yFormat = formatNumber, yMax = null }) {
  const root = canvas(width, height, title);
  root.classList.add("line-chart");
  const box = { x0: PAD.left, x1: width - PAD.right, y0: height - PAD.bottom, y1: PAD.top };
  const all = series.flatMap((s) => s.points).filter((p) => p[1] !== null);
  const xs = all.map((p) => p[0]);
  const xMin = xs.length ? Math.min(...xs) : 0;
  const xMax = xs.length ? Math.max(...xs) : 1;
  // headroom above the highest value, so a flat line does not run along the top edge
  const top = yMax !== null ? yMax : niceMax(1.15 * Math.max(0, ...all.map((p) => p[1])));
  axes(root, box, top, xLabels, yFormat);
  const sx = (x) => box.x0 + (xMax > xMin ? (x - xMin) / (xMax - xMin) : 1) * (box.x1 - box.x0);
  const sy = (y) => box.y0 - (Math.min(y, top) / top) * (box.y0 - box.y1);
  for (const s of series) {
    let d = "";
    let pen = "M";
    for (const [x, y] of s.points) {
      if (y === null) { pen = "M"; continue; }
      d += `${pen}${sx(x).toFixed(1)},${sy(y).toFixed(1)} `;
      pen = "L";
    }
    const path = svg("path", { d: d.trim() || "M0,0", class: `series ${s.cls}` });
    path.dataset.series = s.name;
    const drawn = s.points.filter((p) => p[1] !== null);
    path.dataset.points = String(drawn.length);
    // for readers and tests: whether the latest value is above zero
    path.dataset.nonzero = drawn.length && drawn[drawn.length - 1][1] > 0 ? "yes" : "no";
    root.appendChild(path);
    if (drawn.length) {  // the latest value, and a lone point, as a dot
      const [x, y] = drawn[drawn.length - 1];
      root.appendChild(svg("circle", { cx: sx(x), cy: sy(y), r: 3, class: `dot ${s.cls}` }));
    }
  }
  return root;
}

// bars: [{label, parts: [{value, cls, name}]}], stacked from the bottom in the order given
export function stackedBars({ title, bars, width = 520, height = 170, xTitle = "" }) {
  const root = canvas(width, height, title);
  root.classList.add("bar-chart");
  const box = { x0: PAD.left, x1: width - PAD.right, y0: height - PAD.bottom, y1: PAD.top };
  const top = niceMax(Math.max(0, ...bars.map((b) => b.parts.reduce((n, p) => n + p.value, 0))));
  axes(root, box, top, ["", xTitle], (v) => String(Math.round(v)));
  const slot = (box.x1 - box.x0) / Math.max(bars.length, 1);
  const barWidth = Math.max(3, Math.min(28, slot * 0.7));
  bars.forEach((bar, i) => {
    const x = box.x0 + slot * i + (slot - barWidth) / 2;
    let y = box.y0;
    const group = svg("g", { class: "bar" });
    group.dataset.label = bar.label;
    for (const part of bar.parts) {
      if (!part.value) continue;
      const h = (part.value / top) * (box.y0 - box.y1);
      y -= h;
      const rect = svg("rect", { x, y, width: barWidth, height: h, class: part.cls });
      rect.appendChild(svg("title", {}, `${bar.label}: ${part.value} ${part.name}`));
      group.appendChild(rect);
    }
    if (bars.length <= 24 || i % Math.ceil(bars.length / 24) === 0) {
      group.appendChild(svg("text", { x: x + barWidth / 2, y: box.y0 + 13, class: "tick",
        "text-anchor": "middle" }, bar.label));
    }
    root.appendChild(group);
  });
  return root;
}

// lanes over a model's blocks 0..n: [{label, start, end, cls, note}] plus missing ranges
export function blockLanes({ title, n, lanes, missing, width = 520 }) {
  const laneHeight = 22;
  const height = PAD.top + laneHeight * (lanes.length + 1) + 22;
  const root = canvas(width, height, title);
  root.classList.add("lanes");
  const x0 = 110;
  const x1 = width - PAD.right;
  const sx = (b) => x0 + (b / Math.max(n, 1)) * (x1 - x0);
  lanes.forEach((lane, i) => {
    const y = PAD.top + i * laneHeight;
    root.appendChild(svg("text", { x: x0 - 6, y: y + 15, class: "tick mono",
      "text-anchor": "end" }, lane.label));
    const rect = svg("rect", { x: sx(lane.start), y: y + 3, width: sx(lane.end) - sx(lane.start),
      height: laneHeight - 6, rx: 3, class: lane.cls });
    rect.appendChild(svg("title", {}, `${lane.label}: blocks ${lane.start}–${lane.end} ${lane.note}`));
    root.appendChild(rect);
    root.appendChild(svg("text", { x: (sx(lane.start) + sx(lane.end)) / 2, y: y + 15,
      class: "bar-label", "text-anchor": "middle" }, lane.note));
  });
  const y = PAD.top + lanes.length * laneHeight;
  root.appendChild(svg("text", { x: x0 - 6, y: y + 15, class: "tick", "text-anchor": "end" },
    "missing"));
  for (const [a, b] of missing) {
    root.appendChild(svg("rect", { x: sx(a), y: y + 3, width: sx(b) - sx(a),
      height: laneHeight - 6, class: "missing" }));
  }
  const axisY = y + laneHeight + 12;
  for (const b of [0, Math.round(n / 2), n]) {
    root.appendChild(svg("text", { x: sx(b), y: axisY, class: "tick", "text-anchor": "middle" },
      `block ${b}`));
  }
  return root;
}

// this node in the middle, its peers on a circle, each edge labelled with its latency
export function peerGraph({ title, center, peers, width = 520, height = 300 }) {
  const root = canvas(width, height, title);
  root.classList.add("peer-graph");
  const cx = width / 2;
  const cy = height / 2;
  // an ellipse filling the box, room left for the labels; from the left, clockwise: two
  // peers sit left and right of this node
  const rx = width / 2 - 80;
  const ry = Math.max(0, height / 2 - 42);
  const spots = peers.map((p, i) => {
    const angle = Math.PI + (2 * Math.PI * i) / Math.max(peers.length, 1);
    return [cx + rx * Math.cos(angle), cy + ry * Math.sin(angle)];
  });
  peers.forEach((peer, i) => {
    const [x, y] = spots[i];
    const edge = svg("g", { class: "edge" });
    edge.dataset.peer = peer.id;
    if (peer.latencyMs !== null && peer.latencyMs !== undefined) {
      edge.dataset.latencyMs = String(peer.latencyMs);
    }
    edge.appendChild(svg("line", { x1: cx, y1: cy, x2: x, y2: y, class: peer.edgeCls }));
    const mx = (cx + x) / 2;
    const my = (cy + y) / 2;
    edge.appendChild(svg("rect", { x: mx - 26, y: my - 9, width: 52, height: 16, rx: 8,
      class: "edge-label-bg" }));
    edge.appendChild(svg("text", { x: mx, y: my + 3, class: "edge-label",
      "text-anchor": "middle" }, peer.edgeLabel));
    root.appendChild(edge);
  });
  const node = (x, y, label, sub, cls, id) => {
    const group = svg("g", { class: `node ${cls}` });
    if (id) group.dataset.peer = id;
    group.appendChild(svg("circle", { cx: x, cy: y, r: 9 }));
    group.appendChild(svg("text", { x, y: y + 22, class: "node-label mono",
      "text-anchor": "middle" }, label));
    if (sub) {
      group.appendChild(svg("text", { x, y: y + 34, class: "tick", "text-anchor": "middle" },
        sub));
    }
    root.appendChild(group);
  };
  peers.forEach((peer, i) => node(...spots[i], peer.label, peer.sub, peer.cls, peer.id));
  node(cx, cy, center.label, center.sub, "self", center.id);
  return root;
}

export function legend(items) {
  const box = document.createElement("div");
  box.className = "legend";
  for (const [cls, text] of items) {
    const key = document.createElement("span");
    key.className = `key ${cls}`;
    box.appendChild(key);
    box.appendChild(document.createTextNode(` ${text} `));
  }
  return box;
}
