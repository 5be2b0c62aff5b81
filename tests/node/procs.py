"""Child processes of a test daemon, read from /proc (Linux): which servers it started, and
whether one is gone."""

from __future__ import annotations

from pathlib import Path


def child_pids(parent: int, marker: str) -> list[int]:
    """The live children of process ``parent`` whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] != "Z" and marker in cmdline:
                found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (exited, or a zombie its parent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
