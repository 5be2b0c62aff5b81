// Activity over time and the peer graph. The page keeps the last MAX_SAMPLES pushes of the
// state's running totals (about one a second) and draws tasks per minute and tokens per second
// from them: each point is the change of a total over the window ending at that push.
"use strict";

import { formatNumber, legend, lineChart, peerGraph } from "./charts.js";
import { $, el, short } from "./dom.js";

const MAX_SAMPLES = 600;
const TASK_WINDOW_MS = 60_000;
const TOKEN_WINDOW_MS = 10_000;
const history = [];

export function record(totals) {
  const last = history[history.length - 1];
  // a restarted daemon counts from zero again: start the history over
  if (last && (totals.at_ms < last.at_ms || totals.tasks_ended < last.tasks_ended ||
    totals.tasks_computed < last.tasks_computed)) history.length = 0;
  if (last && totals.at_ms === last.at_ms) return;
  history.push(totals);
  if (history.length > MAX_SAMPLES) history.shift();
}

// the rate of `key` at sample i, per `unitMs`: its change over the window ending at that
// sample, divided by the whole window (so a page open for less than a window does not
// extrapolate one task into a rate); null for the first sample
function rate(i, key, windowMs, unitMs) {
  const now = history[i];
  let j = i;
  while (j > 0 && now.at_ms - history[j - 1].at_ms <= windowMs) j -= 1;
  if (j === i) return null;
  return ((now[key] - history[j][key]) * unitMs) / windowMs;
}

function series(name, cls, key, windowMs, unitMs) {
  return { name, cls, points: history.map((s, i) => [s.at_ms, rate(i, key, windowMs, unitMs)]) };
}

function span() {
  if (history.length < 2) return ["", "now"];
  const seconds = (history[history.length - 1].at_ms - history[0].at_ms) / 1000;
  return [seconds >= 120 ? `${Math.round(seconds / 60)} min ago` : `${Math.round(seconds)} s ago`,
    "now"];
}

function chart(id, caption, lines, unit) {
  const figure = $(id);
  figure.replaceChildren(el("figcaption", caption));
  const last = lines.map((s) => s.points.length ? s.points[s.points.length - 1][1] : null);
  figure.appendChild(lineChart({ title: caption, series: lines, xLabels: span() }));
  figure.appendChild(legend(lines.map((s, i) =>
    [s.cls, `${s.name}: ${formatNumber(last[i] ?? 0)} ${unit}`])));
  figure.dataset.samples = String(history.length);
  figure.dataset.last = JSON.stringify(Object.fromEntries(lines.map((s, i) => [s.name, last[i]])));
}

export function renderActivity() {
  chart("tasks-chart", "Tasks per minute (over the last minute)", [
    series("asked, ended", "s1", "tasks_ended", TASK_WINDOW_MS, 60_000),
    series("computed here", "s2", "tasks_computed", TASK_WINDOW_MS, 60_000),
  ], "/min");
  chart("tokens-chart", "Tokens per second (over the last 10 s)", [
    series("in answers received", "s1", "answer_tokens", TOKEN_WINDOW_MS, 1000),
    series("generated here", "s2", "tokens_generated", TOKEN_WINDOW_MS, 1000),
  ], "tok/s");
}

function reputationClass(peer) {
  if (!peer.reputation) return "rep-unknown";
  const score = peer.reputation.score;
  return score >= 0.6 ? "rep-good" : score >= 0.4 ? "rep-mid" : "rep-low";
}

function latencyClass(ms) {
  if (ms === null || ms === undefined) return "lat-unknown";
  return ms < 50 ? "lat-fast" : ms < 200 ? "lat-mid" : "lat-slow";
}

export function renderPeerGraph(node, peers) {
  const figure = $("peer-graph");
  figure.replaceChildren();
  figure.appendChild(peerGraph({
    title: "this node and its peers, latency on the edges",
    center: { id: node.peer_id, label: short(node.peer_id), sub: "this node" },
    peers: peers.map((p) => ({
      id: p.peer_id, label: short(p.peer_id), cls: reputationClass(p),
      sub: p.reputation ? `rep ${p.reputation.score.toFixed(2)}` : "",
      edgeCls: latencyClass(p.latency_ms), latencyMs: p.latency_ms,
      edgeLabel: p.latency_ms === null || p.latency_ms === undefined ? "? ms" :
        `${p.latency_ms >= 10 ? Math.round(p.latency_ms) : formatNumber(p.latency_ms)} ms`,
    })),
    height: peers.length > 8 ? 360 : peers.length > 2 ? 280 : 150,
  }));
  figure.appendChild(legend([["lat-fast", "< 50 ms"], ["lat-mid", "< 200 ms"],
    ["lat-slow", "slower"], ["rep-good", "reputation ≥ 0.6"], ["rep-low", "< 0.4"]]));
}
