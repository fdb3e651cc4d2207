"""Finding and killing every process of one test run of a Spark driver program.

Spark's Python daemons put themselves in process groups of their own, so killing the driver's
group is not enough: each run exports a token in an environment variable, which every child
(JVM, executors, Python workers) inherits, and the processes carrying it are found in /proc.
"""

from __future__ import annotations

import os
import signal
import time


def processes_with_token(env_var: str, token: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``env_var=token``."""
    needle = f"{env_var}={token}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            if needle not in env:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != b"Z":
            found.append(int(name))
    return found


def kill_run(env_var: str, token: str, pgid: int | None, timeout_s: float = 20.0) -> list[int]:
    """SIGKILL the driver's process group and every process carrying the run's token; wait
    until none is left. Returns the pids that had to be killed besides the group."""
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leftovers: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        alive = processes_with_token(env_var, token)
        if not alive:
            return leftovers
        for pid in alive:
            if pid not in leftovers:
                leftovers.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of run {token} survive SIGKILL: {alive}")
        time.sleep(0.05)


def reap_group(pgid: int, wait_s: float = 15.0) -> None:
    """Wait for a finished program's process group (its JVM) to be gone; SIGKILL what stays."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
