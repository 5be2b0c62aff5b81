"""`symphony ask` and `symphony tasks list/show`: the task market from the command line.

They talk to the local daemon of ``--data-dir`` through its HTTP API (node/control.py); the
daemon runs the auction and the vote. Tables for people, ``--json`` for scripts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from node.cli.daemon_api import (
    api_client,
    call,
    data_dir_option,
    echo_json,
    short_peer,
    stdout_console,
)

#: the CLI waits this much longer than the task's deadline for the daemon's answer
ASK_CLIENT_GRACE_S = 15.0
DEFAULT_DEADLINE_MS = 120_000


def print_task(snap: dict[str, Any], show_cot: bool) -> None:
    from rich.table import Table

    console = stdout_console()
    answer = snap.get("answer")
    status = snap["phase"] + (" (partial)" if snap.get("partial") else "")
    console.print(f"[bold]answer:[/bold] {answer if answer is not None else '-'}   "
                  f"task {snap['task_id'][:16]}  {status}")
    if snap.get("failure"):
        console.print(f"failure: {snap['failure']}")
    if snap.get("mode") == "plan":
        from node.cli.plan_tree import print_plan_tree

        print_plan_tree(snap)
    if snap.get("agent"):
        console.print(f"answered by agent {snap['agent']} on {short_peer(snap['executor'])}")
    need = [f"{k} {snap[k]}" for k in ("needs", "requested_agent") if snap.get(k)]
    if snap.get("skills"):
        need.append("skills " + ",".join(snap["skills"]))
    if need:
        console.print("needs: " + "; ".join(need))
    if snap.get("votes"):
        votes = Table(title="votes")
        for col in ("answer", "weight", "share", "count", "voters"):
            votes.add_column(col)
        for row in snap["votes"]:
            votes.add_row(row["answer"], f"{row['weight']:.3f}", f"{row['share']:.0%}",
                          str(row["count"]), ", ".join(short_peer(v) for v in row["voters"]))
        console.print(votes)
    if snap.get("results"):
        results = Table(title="who computed what")
        for col in ("executor", "agent", "answer", "confidence", "weight", "tokens", "ms",
                    "verified"):
            results.add_column(col)
        for r in snap["results"]:
            weight = "-" if r.get("weight") is None else f"{r['weight']:.3f}"
            # a chain's result (node/market/chain_task.py) states no confidence
            confidence = "-" if r.get("confidence") is None else f"{r['confidence']:.2f}"
            results.add_row(short_peer(r["executor"]), r.get("agent") or "-", r["answer"], confidence,
                            weight, str(r["tokens"]), str(r["compute_ms"]),
                            str(r.get("verification") or "-"))
        console.print(results)
    if snap.get("chain", {}).get("final_route"):
        chain = snap["chain"]
        console.print(f"on a chain ({chain['tokens_per_s']} tokens/s): " + ", ".join(
            f"blocks {h['start']}-{h['end']} {short_peer(h['peer'])}" for h in chain["final_route"]))
    _print_details(snap, show_cot)


def _print_details(snap: dict[str, Any], show_cot: bool) -> None:
    """Checks that did not pass, tool calls, replaced executors and (asked) the CoTs."""
    console = stdout_console()
    # per executor, verification that did not pass: failed, still pending, or not checkable
    for peer, v in sorted(snap.get("verification", {}).items()):
        if v.get("status") not in ("passed", "not_sampled"):
            console.print(f"verification of {short_peer(peer)}: {v.get('status')} "
                          f"{v.get('detail', '')}".rstrip())
    for r in snap.get("results", []):
        for n, tool in enumerate(r.get("tool_calls") or [], 1):
            console.print(f"tool call {n} of {short_peer(r['executor'])}: {tool['name']} "
                          f"{json.dumps(tool['arguments'], sort_keys=True)} -> "
                          f"{tool['output']}", markup=False, highlight=False)
    failed = [a for a in snap.get("attempts", []) if a["state"] == "failed"]
    for a in failed:
        console.print(f"replaced {short_peer(a['peer'])}: {a['reason']}")
    if show_cot:
        for r in snap.get("results", []):
            console.rule(f"CoT of {short_peer(r['executor'])}")
            console.print(r["cot"], markup=False, highlight=False)


@click.command()
@click.argument("question")
@click.option("--k", type=click.IntRange(1, 16), default=None,
              help="Independent executors (default: the node's tasks.default_k, 3).")
@click.option("--model", default="", help="Model name the executors must serve.")
@click.option("--family", default="", help="Model family the executors must serve.")
@click.option("--answer-type", type=click.Choice(["text", "number", "choice", "exact"]),
              default="text", show_default=True)
@click.option("--choice", "choices", multiple=True, help="An option (repeat, for --answer-type "
              "choice).")
@click.option("--deadline-ms", type=click.IntRange(1000, 24 * 3600 * 1000),
              default=DEFAULT_DEADLINE_MS, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=None)
@click.option("--temperature", type=click.FloatRange(0.0, 2.0), default=None,
              help="Sampling temperature of every executor (default: greedy for k = 1, "
              "0.5 for a vote, so the k chains differ).")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Nucleus sampling mass (default 1: off).")
@click.option("--seed", type=click.IntRange(0, (1 << 63) - 1), default=None,
              help="Seed base; each executor's seed derives from it, the task and its attempt.")
@click.option("--needs", default="", help="What the task needs, as text: the agent whose "
              "description fits it best answers.")
@click.option("--skills", default="", help="Skill tags the task needs, comma-separated.")
@click.option("--agent", default="", help="Only this agent (by name) may answer.")
@click.option("--mode", type=click.Choice(["task", "plan"]), default="task", show_default=True,
              help="plan: planners split the question into steps, each step goes to the agent "
              "that fits it, the plans' answers are voted.")
@click.option("--planners", type=click.IntRange(1, 16), default=None,
              help="Planners asked in plan mode (default: the node's tasks.planners, 3).")
@click.option("--json", "as_json", is_flag=True, help="Print the task snapshot as JSON.")
@click.option("--show-cot", is_flag=True, help="Print every executor's chain of thought.")
@data_dir_option
def ask(question: str, k: int | None, model: str, family: str, answer_type: str,
        choices: tuple[str, ...], deadline_ms: int, max_tokens: int | None,
        temperature: float | None, top_p: float | None, seed: int | None, needs: str,
        skills: str, agent: str, mode: str, planners: int | None, as_json: bool, show_cot: bool,
        data_dir: str | None) -> None:
    """Ask the network QUESTION; print the voted answer, the votes and who computed what.

    With --needs, --skills or --agent the task goes to the agent that fits it (matched from
    the agents' cards in the ledger); ``--json`` names the ``agent`` and ``executor`` that gave
    the answer and its ``tool_calls``. With ``--mode plan`` it names the ``plans``: each one's
    ``planner``, ``answer`` and ``steps`` (instruction, requirement, agent, executor, output).

    On a terminal the bids, the chosen executors and the votes are shown live meanwhile.
    """
    client = api_client(data_dir, timeout_s=deadline_ms / 1000 + ASK_CLIENT_GRACE_S)
    body: dict[str, Any] = {"question": question, "answer_type": answer_type,
                            "model": model, "family": family, "choices": list(choices),
                            "deadline_ms": deadline_ms}
    for key, text in (("needs", needs), ("skills", skills), ("agent", agent)):
        if text:
            body[key] = text
    if mode == "plan":
        body["mode"] = "plan"
        if planners is not None:
            body["planners"] = planners
    if k is not None:
        body["k"] = k
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    for key, value in (("temperature", temperature), ("top_p", top_p), ("seed", seed)):
        if value is not None:
            body[key] = value
    if as_json:
        snap = call(client.post, "/tasks/", body)
        echo_json(snap)
    elif mode == "plan":
        snap = call(client.post, "/tasks/", body)
        print_task(snap, show_cot)
    else:
        from node.cli.progress import follow_task

        made = call(client.post, "/tasks/", {**body, "wait": False})
        wait_s = deadline_ms / 1000 + ASK_CLIENT_GRACE_S
        snap = call(lambda: follow_task(client.get, made["task_id"], timeout_s=wait_s))
        print_task(snap, show_cot)
    if snap["phase"] != "done":
        sys.exit(1)


@click.group()
def tasks() -> None:
    """Tasks this node asked the network."""


@tasks.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@data_dir_option
def list_tasks(limit: int, as_json: bool, data_dir: str | None) -> None:
    """Recent tasks, newest first."""
    found = call(api_client(data_dir).get, f"/tasks/?limit={limit}")["tasks"]
    if as_json:
        echo_json(found)
        return
    from rich.table import Table

    table = Table(title="tasks")
    for col in ("task", "phase", "answer", "votes", "k", "question"):
        table.add_column(col)
    for t in found:
        table.add_row(t["task_id"][:16], t["phase"] + ("*" if t.get("partial") else ""),
                      str(t.get("answer") if t.get("answer") is not None else "-"),
                      str(len(t.get("results", []))), str(t["k"]), t["question"][:50])
    stdout_console().print(table)


@tasks.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@click.option("--show-cot", is_flag=True)
@data_dir_option
def show_task(task_id: str, as_json: bool, show_cot: bool, data_dir: str | None) -> None:
    """One task: answer, votes, results, replaced executors."""
    snap = call(api_client(data_dir).get, f"/tasks/{task_id}")
    if as_json:
        echo_json(snap)
    else:
        print_task(snap, show_cot)
