"""Where the CPU of a test run goes, by kind of process (issue 33: the suite's time).

Samples every process's CPU time (user + system, from ``/proc``) every few seconds while a
command runs, keeps each process's last reading and command line (less what a process had
used before the command started: the machine's own agents and kernel threads count only
their share of the run), and prints the CPU by kind:
Cassandra nodes, Spark driver JVMs, local-cluster executors, HDFS, Spark's Python workers, the
simulation's processes, pytest itself, the install. A process that lives less than a sample's
interval is missed, so the figures are a lower bound.

    python3 bench/suite_cpu.py --out /tmp/cpu.json -- scripts/test    # the standard library only
    python3 bench/suite_cpu.py --report /tmp/cpu.json                 # the table again

Run it on a fresh clone, nothing else running: the machine's own agents show as "other".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter

TICK = os.sysconf("SC_CLK_TCK")

#: (kind, words any of which the command line holds), first match wins.
KINDS = (
    ("Cassandra nodes", (".cache/cassandra", "CassandraDaemon")),
    ("HDFS (MiniDFSCluster)", ("hdfs_node", "MiniDFS")),
    ("Spark executors (local-cluster, standalone)", ("CoarseGrainedExecutorBackend",
                                                     "deploy.worker", "deploy.master")),
    ("Spark driver JVMs", ("SparkSubmit", "pyspark/jars", "pyspark/conf")),
    ("Spark's Python workers", ("pyspark.daemon", "pyspark.worker", "pyspark/daemon")),
    ("the simulation's processes", ("multiprocessing.spawn",)),
    ("pytest", ("pytest",)),
    ("the install (pip, venv)", ("pip", "bootstrap", "ensurepip")),
    ("Maven (the servers' jars)", ("plexus-classworlds",)),
    ("other Python programs (driver programs, flush workers)", ("python",)),
)


def kind_of(cmd: str) -> str:
    for kind, words in KINDS:
        if any(word in cmd for word in words):
            return kind
    return "other (the machine's own, or unnamed)"


def readings() -> dict:
    """``{"<pid>:<start time>": (CPU seconds so far, command line)}`` of every process but
    this one (a reused pid is another key)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        out[f"{pid}:{fields[19]}"] = (cpu, cmd)
    return out


def machine_ticks() -> list[int]:
    """The first line of ``/proc/stat``: the whole machine's user, nice, system, idle, iowait,
    irq, softirq, steal ticks so far."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def machine_share(before: list[int], after: list[int]) -> str:
    """How the machine's cores spent the run: busy (user and system, every process and the
    kernel's threads, however short-lived) and idle."""
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    busy = d[0] + d[1] + d[2] + d[5] + d[6]
    return (f"the machine: {100 * busy / total:.0f}% busy ({100 * (d[0] + d[1]) / total:.0f}% user, "
            f"{100 * (d[2] + d[5] + d[6]) / total:.0f}% system), {100 * d[3] / total:.0f}% idle, "
            f"{100 * d[4] / total:.0f}% waiting on I/O, {100 * d[7] / total:.0f}% stolen")


def sample(seen: dict, baseline: dict, stop: threading.Event, every_s: float) -> None:
    """Every ``every_s`` until ``stop``: each process's CPU since the run began (its reading
    less its ``baseline`` one, for a process already running then) into ``seen``."""
    while not stop.is_set():
        for key, (cpu, cmd) in readings().items():
            used = cpu - baseline.get(key, (0.0, ""))[0]
            used_before, cmd_before = seen.get(key, (0.0, ""))
            seen[key] = (max(used, used_before), cmd or cmd_before)
        stop.wait(every_s)


def report(seen: dict) -> str:
    by_kind, count = Counter(), Counter()
    for cpu, cmd in seen.values():
        by_kind[kind_of(cmd)] += cpu
        count[kind_of(cmd)] += 1
    total = sum(by_kind.values()) or 1.0
    lines = [f"{'CPU min':>8} {'share':>6} {'procs':>6}  kind"]
    for kind, cpu in by_kind.most_common():
        lines.append(f"{cpu / 60:8.1f} {100 * cpu / total:5.0f}% {count[kind]:6d}  {kind}")
    lines.append(f"{total / 60:8.1f}   100%          in all")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", help="write every process's reading here (JSON)")
    p.add_argument("--report", metavar="JSON", help="print the table of an earlier --out")
    p.add_argument("--every", type=float, default=2.0, help="seconds between samples (2)")
    p.add_argument("command", nargs="*", help="the command to run and measure")
    args = p.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print(report({k: tuple(v) for k, v in json.load(f).items()}))
        return 0
    if not args.command:
        p.error("give a command after --, or --report JSON")
    seen: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, readings(), stop, args.every),
                               daemon=True)
    sampler.start()
    started, ticks = time.monotonic(), machine_ticks()
    rc = subprocess.call(args.command)
    share = machine_share(ticks, machine_ticks())
    stop.set()
    sampler.join()
    wall = time.monotonic() - started
    if args.out:
        with open(args.out, "w") as f:
            json.dump(seen, f)
    print(f"\n{' '.join(args.command)}: exit {rc} in {wall / 60:.1f} min wall "
          f"({os.cpu_count()} cores: {wall * os.cpu_count() / 60:.1f} CPU-min at most)")
    print(share)
    print(report(seen))
    return rc


if __name__ == "__main__":
    sys.exit(main())
