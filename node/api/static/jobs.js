// The heavier job kinds' sections: distributed-inference chains and the RL run, drawn from the
// state's "inference" and "rl" views (node/api/dashboard_jobs.py).
"use strict";

import { blockLanes, formatNumber, legend, lineChart, stackedBars } from "./charts.js";
import { el, facts, short, table } from "./dom.js";

const RL_VERSION_ROWS = 8;

function body(sectionId) {
  const node = document.querySelector(`#${sectionId} .job-body`);
  node.replaceChildren();
  return node;
}

function tokS(value) {
  return value === null || value === undefined ? "—" : `${formatNumber(value)} tok/s`;
}

function peerName(peer, self) {
  return self ? "this node" : short(peer);
}

export function renderInference(view) {
  const box = body("job-inference");
  if (!view) {
    box.appendChild(el("p", "This node runs no distributed-inference service.", "muted"));
    return;
  }
  const own = view.serving ? `blocks ${view.blocks[0]}–${view.blocks[1]}, ` +
    `${formatNumber(view.ms_per_block)} ms/block` : "none";
  box.appendChild(facts([
    ["model", view.model || "none"],
    ["blocks", view.n_blocks || "—"],
    ["served here", own],
    ["sessions open", view.sessions],
    ["stages offered", view.stages.length],
    ["chain, estimated", view.chain ? tokS(view.chain.tokens_per_s) : "—"],
  ]));
  for (const problem of [view.problem, view.chain_problem]) {
    if (problem) box.appendChild(el("p", problem, "bad"));
  }
  if (!view.n_blocks) return;
  const inChain = new Set((view.chain ? view.chain.hops : []).map((h) => h.peer));
  box.appendChild(el("h3", "Who serves which blocks"));
  box.appendChild(blockLanes({
    title: `block servers of ${view.model}`, n: view.n_blocks, missing: view.missing, width: 720,
    lanes: view.stages.map((s) => ({ label: peerName(s.peer, s.self), start: s.start,
      end: s.end, cls: inChain.has(s.peer) ? "in-chain" : "offer", note: tokS(s.tokens_per_s) })),
  }));
  box.appendChild(legend([["in-chain", "in the chain this node would use"], ["offer", "offered"],
    ["missing", "served by no one"]]));
  if (view.chain) {
    box.appendChild(el("h3", "The chain this node would use now"));
    const hops = view.chain.hops.map((h, i) => ({ data: { hop: String(i), peer: h.peer },
      cells: [i + 1, [peerName(h.peer, h.self), "mono"], `${h.start}–${h.end}`,
        `${formatNumber(h.compute_ms)} ms`,
        `${formatNumber(h.rtt_ms)} ms${h.rtt_measured ? "" : " (assumed)"}`,
        tokS(h.tokens_per_s)] }));
    hops.push({ data: {}, cells: [["whole chain", "total"], "", `0–${view.n_blocks}`, "", "",
      [`${formatNumber(view.chain.ms_per_token)} ms/token = ${tokS(view.chain.tokens_per_s)}`,
        "total"]] });
    box.appendChild(table(["stage", "peer", "blocks", "compute/token", "round trip",
      "stage alone"], hops, "no chain", "inference-chain"));
  }
  box.appendChild(el("h3", "Stages offered"));
  box.appendChild(table(["peer", "blocks", "ms/block", "tokens/s", "sessions free", "ping"],
    view.stages.map((s) => ({ data: { peer: s.peer },
      cells: [[peerName(s.peer, s.self), "mono"], `${s.start}–${s.end}`,
        formatNumber(s.ms_per_block), tokS(s.tokens_per_s), `${s.free_sessions}/${s.max_sessions}`,
        s.rtt_ms === null ? "—" : `${formatNumber(s.rtt_ms)} ms`] })),
    "no block server in the ledger yet", "inference-stages"));
}

function counterTable(title, counters) {
  const details = el("details");
  details.appendChild(el("summary", title));
  details.appendChild(table(["counter", "count"],
    Object.entries(counters || {}).map(([k, v]) => [[k, "mono"], v]), "none yet"));
  return details;
}

function rlLearner(box, learner, view, nowMs) {
  box.appendChild(el("h3", "Learner's job book"));
  box.appendChild(facts([
    ["policy version", learner.version],
    ["staleness bound", learner.staleness],
    ["jobs in flight", learner.in_flight],
    ["groups waiting", learner.waiting_groups],
    ["groups dropped", learner.dropped_groups],
    ["workers excluded", (learner.excluded || []).length],
  ]));
  const charts = el("div", null, "charts");
  const steps = view.steps || [];
  const curve = el("figure", null, "chart");
  curve.id = "rl-reward";
  curve.appendChild(el("figcaption", "Reward and held-out accuracy per learner step"));
  if (steps.length) {
    const series = [{ name: "reward", cls: "s1",
      points: steps.map((s) => [s.version, s.mean_reward]) }];
    if (steps.some((s) => s.heldout_accuracy !== null && s.heldout_accuracy !== undefined)) {
      series.push({ name: "held-out", cls: "s2",
        points: steps.map((s) => [s.version, s.heldout_accuracy ?? null]) });
    }
    curve.appendChild(lineChart({ title: "reward per step", series, width: 420,
      xLabels: [`v${steps[0].version}`, `v${steps[steps.length - 1].version}`] }));
    curve.appendChild(legend(series.map((s) => [s.cls, s.name])));
  } else {
    curve.appendChild(el("p", "No reward reported to this node yet: the learner process " +
      "scores the groups (symphony rl train prints and plots its reward).", "muted note"));
  }
  charts.appendChild(stalenessChart(view.versions));
  charts.appendChild(curve);
  box.appendChild(charts);
  box.appendChild(versionTable(view.versions, nowMs));
  box.appendChild(counterTable("job book counters", learner.book));
  box.appendChild(counterTable("auction counters", learner.counters));
}

function lagClass(lag) {
  return `lag-${Math.min(Number(lag), 2)}`;
}

function stalenessChart(versions) {
  const figure = el("figure", null, "chart");
  figure.id = "rl-staleness";
  figure.appendChild(el("figcaption", "Groups accepted per policy version, by staleness"));
  const bars = versions.map((v) => ({ label: `v${v.version}`, parts: [
    ...Object.entries(v.staleness).sort((a, b) => Number(a[0]) - Number(b[0])).map(
      ([lag, n]) => ({ value: n, cls: lagClass(lag), name: `accepted ${lag} behind` })),
    { value: v.stale, cls: "stale", name: "refused as stale" }] }));
  figure.appendChild(stackedBars({ title: "groups per version", bars, width: 420,
    xTitle: "policy version" }));
  figure.appendChild(legend([["lag-0", "same version"], ["lag-1", "1 behind"],
    ["lag-2", "2+ behind"], ["stale", "refused as stale"]]));
  return figure;
}

// how long before `nowMs` an instant of the daemon's clock (monotonic, not the wall clock) was
function ago(atMs, nowMs) {
  if (atMs === null || atMs === undefined) return ["—", "muted"];
  const seconds = Math.max(0, Math.round((nowMs - atMs) / 1000));
  return seconds >= 120 ? `${Math.round(seconds / 60)} min ago` : `${seconds} s ago`;
}

function versionTable(versions, nowMs) {
  const rows = versions.slice(-RL_VERSION_ROWS).reverse().map((v) => ({
    data: { version: String(v.version) },
    cells: [`v${v.version}`, ago(v.published_at_ms, nowMs), v.accepted,
    Object.entries(v.staleness).map(([lag, n]) => `${n} × ${lag} behind`).join(", ") || "—",
    v.stale] }));
  return table(["version", "published", "groups accepted", "staleness", "refused stale"], rows,
    "no version published or group accepted yet", "rl-versions");
}

function rlWorker(box, worker) {
  box.appendChild(el("h3", "Rollout worker"));
  if (!worker.enabled) {
    box.appendChild(el("p", worker.problem || "This node takes no rollout jobs.", "muted"));
    return;
  }
  const adapters = worker.adapters;
  const swaps = adapters ? adapters.swaps : [];
  box.appendChild(facts([
    ["model", worker.model],
    ["versions held", (worker.versions || []).join(", ") || "—"],
    ["busy", `${worker.busy} of ${worker.slots}`],
    ["groups generated", worker.generated],
    ["failed", worker.failed],
    ["adapter", swaps.length ? `v${swaps[swaps.length - 1].version}` : "base model"],
  ], "worker"));
  box.appendChild(counterTable("worker counters", worker.counters));
}

// nowMs: the daemon's clock at this push (the state's totals.at_ms)
export function renderRl(view, nowMs) {
  const box = body("job-rl");
  if (!view) {
    box.appendChild(el("p", "This node runs no RL service.", "muted"));
    return;
  }
  if (view.learner) rlLearner(box, view.learner, view, nowMs);
  if (view.worker) rlWorker(box, view.worker);
}
