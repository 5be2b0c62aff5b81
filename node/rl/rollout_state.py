"""The learner's rollout run kept in the daemon's SQLite, so a restarted daemon resumes it.

One row (``rl_jobs_state``) holds, as JSON, what a run needs to go on where it stopped:

* ``run``: the run's fields as the learner set them (``POST /rl_jobs/run``, without version);
* ``version``: the policy version being trained. A restarted daemon starts its book there, and
  ``POST /rl_jobs/version`` refuses anything older, so a version number is never taken back;
* ``excluded``: the workers caught cheating in this run (they stay excluded);
* ``open``: how many jobs of each policy version were issued and not yet answered. Their ids
  die with the process (a worker's late answer to one is ignored); the restarted daemon issues
  as many new jobs for the same versions that are still within the staleness bound.

The row is written after every change the learner makes (run, issue, version, conviction) and
after every group accepted or worker attested.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.rl.jobs import JobBook, JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS rl_jobs_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL            -- node/rl/rollout_state.py's snapshot as JSON
);
"""

#: job states still waiting for a group
OPEN_STATES = (JobState.OPEN, JobState.RUNNING)


def snapshot(run: dict[str, Any], book: JobBook) -> dict[str, Any]:
    open_jobs: dict[str, int] = {}
    for record in book.jobs.values():
        if record.state in OPEN_STATES:
            key = str(record.job.policy_version)
            open_jobs[key] = open_jobs.get(key, 0) + 1
    return {"run": dict(run), "version": book.version, "excluded": sorted(book.excluded),
            "open": open_jobs}


def save(db: Any, state: dict[str, Any]) -> None:
    if db is None:
        return
    db.execute("INSERT INTO rl_jobs_state(id, state) VALUES(1, ?) ON CONFLICT(id) "
               "DO UPDATE SET state = excluded.state", (json.dumps(state, sort_keys=True),))


def load(db: Any) -> dict[str, Any] | None:
    """The saved snapshot; None when there is none. ValueError names what is unreadable."""
    if db is None:
        return None
    rows = db.query("SELECT state FROM rl_jobs_state WHERE id = 1")
    if not rows:
        return None
    try:
        state = json.loads(rows[0]["state"])
    except ValueError as exc:
        raise ValueError(f"rl_jobs_state is not JSON: {exc}") from None
    ok = (isinstance(state, dict) and isinstance(state.get("run"), dict)
          and type(state.get("version")) is int and isinstance(state.get("excluded"), list)
          and isinstance(state.get("open"), dict)
          and all(k.isdigit() and type(v) is int and v >= 0 for k, v in state["open"].items()))
    if not ok:
        raise ValueError("rl_jobs_state lacks run, version, excluded or open jobs")
    return state
