"""Network namespaces for the NAT tests: a command that must succeed, and why namespaces cannot
be made here ("" when they can)."""

from __future__ import annotations

import os
import shutil
import subprocess


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def why_not() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"g19probe{os.getpid() % 10000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""
