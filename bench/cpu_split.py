"""CPU seconds a command costs the Cassandra node, and the rest of the machine, while it runs.

On a machine where the node shares the CPUs with its clients, a client that sends more, smaller
requests makes the node work harder for the same rows, and the node's CPU is the clients' too.
This runs a command (e.g. one contestant of ``bench_sinks.py``), and reports CPU seconds from
``/proc``: the node's process (``utime + stime`` of the java process listening on the port),
and the whole machine (``/proc/stat``), before and after. Anything else running on the machine
counts as "the rest": run it on a quiet machine.

    CASSANDRA_PORT=19542 .venv/bin/python bench/cpu_split.py --port 19542 -- \\
        .venv/bin/python bench/bench_sinks.py --rows 1000000 --reps 1 --batch-rows 250000 \\
        --contestants ours --memory-batches '' --no-profile --plots '' --out /tmp/ours.json

Prints one JSON line: ``{"node_cpu_s", "machine_cpu_s", "rest_cpu_s", "wall_s", "command"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "contestants"))
from common import machine_busy_s  # noqa: E402 - the contestants' reading of /proc/stat

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICKS


def listening_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:``port`` (the node's native port)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":   # LISTEN
                    inodes.add(cols[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    raise SystemExit(f"no process listens on port {port}: start the node first")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="the node's native (CQL) port")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    node = listening_pid(args.port)
    node_before, machine_before, started = process_cpu_s(node), machine_busy_s(), time.monotonic()
    code = subprocess.call(command)
    node_s = process_cpu_s(node) - node_before
    machine_s = machine_busy_s() - machine_before
    print(json.dumps({"node_cpu_s": round(node_s, 1), "machine_cpu_s": round(machine_s, 1),
                      "rest_cpu_s": round(machine_s - node_s, 1),
                      "wall_s": round(time.monotonic() - started, 1), "command": command}))
    return code


if __name__ == "__main__":
    sys.exit(main())
