// The node dashboard: renders the state document pushed on /dashboard/events (server-sent
// events) and sends the chat box's questions to /dashboard/ask. A module: it imports the
// charts (charts.js), the activity chart and peer graph (activity.js) and the job sections
// (jobs.js) from the same static folder. Everything a peer wrote (questions, answers, model
// names, agent cards, tool calls) is inserted as text, never as HTML.
"use strict";

import { record, renderActivity, renderPeerGraph } from "./activity.js";
import { $, cell, el, fill, listCell, short } from "./dom.js";
import { renderInference, renderRl } from "./jobs.js";
import { planRow } from "./plans.js";

// event fields holding peer ids or hashes, shown shortened
const ID_FIELDS = new Set(["task_id", "peer", "executor", "requester", "verifier", "source",
  "id", "signer", "worker", "learner", "job_id"]);

function renderNode(node) {
  $("title-peer").textContent = short(node.peer_id);
  const facts = [
    ["peer id", node.peer_id],
    ["network", node.network_id],
    ["addresses", (node.addresses || []).join("\n")],
    ["models", (node.models || []).map((m) =>
      `${m.name} (${m.quantization || m.family}, ${Math.round(m.tokens_per_s)} tok/s)`)
      .join(", ") || "none (not executing)"],
    ["device", node.device ? `${node.device.kind}: ${node.device.name}` : "unknown"],
    ["slots", node.executing ? `${node.free_slots} free of ${node.slots}` : "—"],
    ["uptime", node.uptime_s === undefined ? "" : `${Math.round(node.uptime_s)} s`],
    ["version", node.versions ? `${node.versions.agent} (protocol ${node.versions.protocol})` : ""],
  ];
  const dl = $("node-facts");
  dl.replaceChildren();
  for (const [key, value] of facts) {
    dl.appendChild(el("dt", key));
    dl.appendChild(el("dd", value, key === "peer id" || key === "addresses" ? "mono" : ""));
  }
}

function renderPeers(peers) {
  $("peer-count").textContent = `(${peers.length})`;
  const rows = peers.map((p) => {
    const tr = el("tr");
    tr.dataset.peer = p.peer_id;
    cell(tr, short(p.peer_id), "mono").title = p.peer_id;
    cell(tr, p.state);
    cell(tr, p.latency_ms === null || p.latency_ms === undefined ? "—" : `${p.latency_ms} ms`);
    cell(tr, p.reputation ? p.reputation.score.toFixed(3) : "—");
    cell(tr, p.reputation ? p.reputation.evidence : "—");
    cell(tr, p.attestations);
    cell(tr, (p.models || []).join(", ") || "—");
    cell(tr, p.agent || "—", "muted");
    return tr;
  });
  fill($("peer-rows"), rows, "no peer connected", 8);
}

function renderTasks(tasks) {
  const rows = tasks.flatMap((t) => {
    const tr = el("tr");
    tr.dataset.task = t.task_id;
    cell(tr, short(t.task_id), "mono").title = t.task_id;
    cell(tr, t.phase, `phase-${t.phase}`);
    cell(tr, t.question);
    listCell(tr, t.bids.map((b) => `${short(b.peer)} price ${b.price} match ${b.match}`));
    listCell(tr, t.executors.map((e) => `${short(e.peer)} ${e.state}`));
    listCell(tr, t.votes.map((v) => `${v.answer}: ${v.count} (${Math.round(v.share * 100)}%)`));
    listCell(tr, t.verification.map((c) =>
      `${short(c.executor)} ${c.final ? "→" : "by " + short(c.verifier)} ${c.outcome}`));
    cell(tr, t.answer !== null ? t.answer : (t.failure || "…"));
    const calls = (t.tool_calls || []).map((c) =>
      `${short(c.executor)} ${c.name} ${c.arguments} → ${c.output}`);
    listCell(tr, t.agent ? [`agent ${t.agent}`, ...calls] : calls).classList.add("tool-calls");
    return t.plan ? [tr, planRow(t, 9)] : [tr];
  });
  fill($("task-rows"), rows, "no task yet: ask the network above", 9);
}

// the network's agents: a tool is marked read-only or side-effecting, as its card declares
function renderAgents(agents) {
  $("agent-count").textContent = `(${agents.length})`;
  const rows = agents.map((a) => {
    const tr = el("tr");
    tr.dataset.agent = a.name;
    tr.dataset.peer = a.peer_id;
    cell(tr, a.name).title = a.description;
    cell(tr, a.self ? "this node" : short(a.peer_id), "mono").title = a.peer_id;
    cell(tr, a.skills.join(", ") || "—");
    listCell(tr, a.tools.map((tool) =>
      `${tool.name} (${tool.side_effects ? "side-effecting" : "read-only"})`));
    cell(tr, `${a.price_per_1k_tokens} / 1k tokens`);
    cell(tr, a.reputation.toFixed(3));
    cell(tr, a.vector_verified ? "verified" : (a.has_vector ? "unchecked" : "no vector"),
      a.vector_verified ? "" : "muted");
    return tr;
  });
  fill($("agent-rows"), rows, "no agent in the ledger yet", 7);
}

function renderRelay(versions) {
  const rows = versions.map((v) => {
    const tr = el("tr");
    cell(tr, `${v.name} v${v.version}`);
    cell(tr, v.state);
    const td = cell(tr, "");
    const bar = el("progress");
    bar.max = v.chunks || 1;
    bar.value = v.held;
    td.appendChild(bar);
    td.appendChild(el("span", ` ${v.held}/${v.chunks}`, "muted"));
    cell(tr, `${(v.total_size / 1048576).toFixed(1)} MiB`);
    cell(tr, short(v.source), "mono");
    cell(tr, short(v.parent), "mono");
    cell(tr, (v.children || []).length);
    return tr;
  });
  fill($("relay-rows"), rows, "no weight transfer", 7);
}

function renderEvents(events) {
  const list = $("event-list");
  list.replaceChildren();
  for (const e of events) {
    const li = el("li");
    li.appendChild(el("span", e.event, "mono"));
    const detail = Object.entries(e.fields).map(([k, v]) =>
      `${k}=${ID_FIELDS.has(k) ? short(v) : v}`);
    li.appendChild(el("span", " " + detail.join(" "), "muted"));
    list.appendChild(li);
  }
}

function render(state) {
  renderNode(state.node);
  renderPeers(state.peers);
  renderTasks(state.tasks);
  renderAgents(state.agents || []);
  renderRelay(state.relay);
  renderInference(state.inference);
  renderRl(state.rl, state.totals.at_ms);
  renderEvents(state.events);
  record(state.totals);
  renderActivity();
  renderPeerGraph(state.node, state.peers);
}

function connect() {
  const source = new EventSource("/dashboard/events");
  const badge = $("live");
  source.onopen = () => { badge.textContent = "live"; badge.className = "badge on"; };
  source.onerror = () => { badge.textContent = "reconnecting"; badge.className = "badge off"; };
  source.onmessage = (message) => render(JSON.parse(message.data));
}

async function ask(event) {
  event.preventDefault();
  const input = $("question");
  const question = input.value.trim();
  if (!question) return;
  const button = $("ask");
  const item = el("li");
  item.appendChild(el("div", question, "q"));
  const answer = el("div", "asking the network…", "a muted");
  item.appendChild(answer);
  $("conversation").prepend(item);
  button.disabled = true;
  try {
    const reply = await fetch("/dashboard/ask", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Symphony-Dashboard": "1" },
      body: JSON.stringify({ question, k: Number($("k").value) }),
    });
    const body = await reply.json();
    if (!reply.ok) {
      answer.textContent = `error: ${body.error}`;
      answer.className = "a bad";
    } else if (body.phase === "done") {
      answer.textContent = body.answer;
      answer.className = "a answer";
      input.value = "";
    } else {
      answer.textContent = `task ${body.phase}: ${body.failure || ""}`;
      answer.className = "a bad";
    }
  } catch (err) {
    answer.textContent = `the node did not answer (${err})`;
    answer.className = "a bad";
  } finally {
    button.disabled = false;
  }
}

// a module runs after the document is parsed
$("ask-form").addEventListener("submit", ask);
connect();
