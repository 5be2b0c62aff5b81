// The plan tree of a plan-mode task (the state's task.plan, node/api/dashboard_plans.py):
// each plan's planner and state, its steps (instruction, requirement, agent and executor,
// output, tool calls) and the vote over the plans. Redrawn at each push of the state, so it
// grows as the steps complete. Everything a planner or executor wrote is inserted as text.
"use strict";

import { el, short } from "./dom.js";

function stepItem(step) {
  const li = el("li", null, step.done ? "plan-step done" : "plan-step");
  const ran = step.executor ? `${step.agent || "—"} on ${short(step.executor)}` : "not run yet";
  const tries = step.peers_tried > 1 ? `, ${step.peers_tried} executors` : "";
  li.appendChild(el("span", `step ${step.n}: ${step.instruction}`, "plan-instruction"));
  li.appendChild(el("span", ` [${step.requirement}] → ${ran}${tries}`, "muted"));
  const sub = el("ul");
  if (step.output) sub.appendChild(el("li", `output: ${step.output}`, "plan-output"));
  for (const c of step.tool_calls) {
    sub.appendChild(el("li", `tool ${c.name} ${c.arguments} → ${c.output}`, "tool-calls"));
  }
  if (sub.childElementCount) li.appendChild(sub);
  return li;
}

function planItem(plan) {
  const li = el("li", null, `plan plan-${plan.state}`);
  let label = `plan ${plan.n} by ${plan.planner ? short(plan.planner) : "—"}: ${plan.state}`;
  label += ` (${plan.steps_done}/${plan.steps.length} steps)`;
  if (plan.answer) label += `, answer ${plan.answer}`;
  if (plan.failure) label += ` — ${plan.failure}`;
  li.appendChild(el("span", label));
  const steps = el("ol");
  for (const r of plan.replaced) {
    steps.appendChild(el("li", `replaced planner ${short(r.planner)}: ${r.why}`, "muted"));
  }
  for (const step of plan.steps) steps.appendChild(stepItem(step));
  li.appendChild(steps);
  return li;
}

// one table row, spanning the task table, holding the tree of plan task t
export function planRow(t, columns) {
  const tr = el("tr", null, "plan-row");
  tr.dataset.planOf = t.task_id;
  const td = el("td");
  td.colSpan = columns;
  const tree = el("ul", null, "plan-tree");
  for (const plan of t.plan.plans) tree.appendChild(planItem(plan));
  if (t.plan.votes.length) {
    const votes = t.plan.votes.map((v) =>
      `${v.answer}: ${v.count} plan(s), ${Math.round(v.share * 100)}%`).join("; ");
    tree.appendChild(el("li", `vote: ${votes}`, "plan-vote"));
  }
  td.appendChild(el("div", `plan tree: ${t.plan.steps_done} of ${t.plan.steps_total} steps done`,
    "muted"));
  td.appendChild(tree);
  tr.appendChild(td);
  return tr;
}
