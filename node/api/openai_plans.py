"""A plan-mode task's progress as lines of text (the OpenAI stream of a plan-mode request).

:class:`PlanProgress` compares each new snapshot of a plan task (node/market/live_plans.py)
with what it already reported and returns one line per new event, in the order they are
seen: a planner's plan received (its number of steps), a step completed (its instruction,
the agent and executor that ran it, its output), a planner replaced, a plan failed. The
texts a planner or executor wrote are put on one line and cut to ``SHOWN_CHARS``.
"""

from __future__ import annotations

from typing import Any

#: characters of a planner's or executor's text in one progress line
SHOWN_CHARS = 200


def _one_line(text: object, n: int = SHOWN_CHARS) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= n else line[:n - 1] + "…"


def _peer(peer: object) -> str:
    return str(peer or "-")[:12]


class PlanProgress:
    def __init__(self) -> None:
        #: the events already reported: (kind, plan number, index)
        self.sent: set[tuple[str, int, int]] = set()

    def _new(self, key: tuple[str, int, int]) -> bool:
        if key in self.sent:
            return False
        self.sent.add(key)
        return True

    def _plan_lines(self, n: int, plan: dict[str, Any]) -> list[str]:
        lines = []
        for j, old in enumerate(plan.get("replaced") or []):
            if self._new(("replaced", n, j)):
                lines.append(f"plan {n}: planner {_peer(old.get('planner'))} replaced "
                             f"({_one_line(old.get('why'))})\n")
        steps = plan.get("steps") or []
        # a replanned slot starts its steps again: the plan's line counts its planners
        tag = len(plan.get("replaced") or [])
        if steps and self._new(("plan", n, tag)):
            lines.append(f"plan {n} by {_peer(plan.get('planner'))}: {len(steps)} steps\n")
        for i, step in enumerate(steps, 1):
            if step.get("done") and self._new(("step", n, tag * 100 + i)):
                lines.append(f"plan {n} step {i}/{len(steps)} ({step.get('agent') or '-'} on "
                             f"{_peer(step.get('executor'))}): "
                             f"{_one_line(step.get('instruction'))} -> "
                             f"{_one_line(step.get('output'))}\n")
        if plan.get("state") == "failed" and self._new(("failed", n, 0)):
            lines.append(f"plan {n} failed: {_one_line(plan.get('failure'))}\n")
        return lines

    def lines(self, snap: dict[str, Any]) -> list[str]:
        """The lines for what ``snap`` shows that earlier snapshots did not."""
        return [line for n, plan in enumerate(snap.get("plans") or [], 1)
                for line in self._plan_lines(n, plan)]

    @staticmethod
    def answer_line(snap: dict[str, Any]) -> str:
        """The last line of a finished plan task's stream: the voted answer."""
        return f"answer: {snap.get('answer') or ''}"
