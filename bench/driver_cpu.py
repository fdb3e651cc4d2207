"""The driver's Python-process CPU per batch against the batch's segments (issue 32).

A WAL with ``B`` batches pending (sealed, committed by Spark, not flushed), each of ``S``
segments of a few rows, built through the real ``wal`` API (``tests/helpers/walfactory.py``)
in a temp folder, with no log yet (so that any release's code can open it). Then, in a fresh
Python process per measurement, the driver's work for the first of those batches, phase by
phase, each timed with ``time.process_time()``, in the order a drain does it
(``recovery/replay.py``: ``Replayer.run`` and ``Replayer.flush``):

- ``plan``: ``catalog.describe`` of the WAL, the drain's look at every pending batch;
- ``seal_read``: ``read_seal`` of the batch;
- ``ingest``: ``WalLog.ingest`` (the segments' rows copied into the RocksDB log);
- ``progress``: ``begin_flush``, then one ``record_progress`` per segment, as the
  ``processes`` and ``executors`` flush modes acknowledge (one acknowledgement a segment);
  the rows go nowhere: no Cassandra, no Spark;
- ``mark``: ``mark_flushed`` and the WAL's flushed marker;
- ``retention``: the batch's staged files removed, ``apply_retention``;
- ``health``: one ``read_health`` (a scrape, ``sinks.status``) and the commit's
  ``backlog_bytes`` (``sinks/worker/plan.py``), with ``B - 1`` batches still pending.

Opening the log (once per process) is reported apart and not counted per batch. The JVM's
scheduling of the tasks and the commit worker are not measured.

``--old REV`` measures another commit's code side by side: a temporary ``git worktree`` of
REV, its measuring processes run with that tree first on ``sys.path``; old and new alternate
within each round, and the sizes alternate in order between rounds. Medians, and the ratio
old/new per size. ``--profile`` prints a cProfile of each size's phases (this tree's code)
instead.

    .venv/bin/python bench/driver_cpu.py [--segments 10,100,400,1000,2000] [--pending 10] \\
        [--rows 3] [--rounds 3] [--old REV] [--old-max-segments 1000] [--profile] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "driver_cpu.json"
PHASES = ("plan", "seal_read", "ingest", "progress", "mark", "retention", "health")
GOAL_S = 1.0          # issue 32: at most 1 CPU s for 2,000 segments with 10 pending


# ------------------------------------------------------------------ the measuring process
def measure(root: str, profile: bool) -> dict:
    """The phases of the first pending batch of the WAL at ``root`` (checkpoint ``root/cp``),
    with whatever code is first on ``sys.path``."""
    from recovery.health import read_health
    from sinks.worker.plan import backlog_bytes
    from wal import catalog
    from wal.catalog import RecoveryAction
    from wal.layout import WalDir
    from wal.log import WalLog
    from wal.recovery_policy import RecoveryPolicy
    from wal.retention import RetentionPolicy, apply_retention, remove_batch_files
    from wal.seal import read_seal

    wal, cp = WalDir.at(os.path.join(root, "wal")), os.path.join(root, "cp")
    clock = time.process_time
    out: dict = {}
    started = clock()
    wal_log = WalLog.open_writer(wal)
    out["open"] = clock() - started
    profiler = None
    if profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    try:
        t = clock()
        views = catalog.describe(wal, wal_log, cp, RecoveryPolicy.QUERY_FLUSHER)
        pending = [v.batch for v in views if v.action == RecoveryAction.REPLAY]
        batch = pending[0]
        out["plan"], t = clock() - t, clock()
        seal = read_seal(wal, batch)
        out["seal_read"], t = clock() - t, clock()
        wal_log.ingest(seal)
        out["ingest"], t = clock() - t, clock()
        wal_log.begin_flush(batch)
        done = 0
        for i, ref in enumerate(seal.segments):
            done += ref.rows
            wal_log.record_progress(batch, i + 1, 0, done)
        out["progress"], t = clock() - t, clock()
        wal_log.mark_flushed(batch)
        wal.write_flushed_through(batch)
        out["mark"], t = clock() - t, clock()
        remove_batch_files(wal, batch, keep_seal=True)
        apply_retention(wal, wal_log, RetentionPolicy())
        out["retention"], t = clock() - t, clock()
        health = read_health(wal, cp)
        backlog = backlog_bytes(wal, pending[-1] + 1)
        out["health"] = clock() - t
    finally:
        if profiler is not None:
            profiler.disable()
        wal_log.close()
    out["total"] = sum(out[p] for p in PHASES)
    out["pending_before"] = len(pending)
    out["pending_after"] = health.pending_batches
    out["segments"] = len(seal.segments)
    out["backlog_bytes"] = backlog
    if profiler is not None:
        import io
        import pstats
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
        out["profile"] = text.getvalue()
    return out


# ---------------------------------------------------------------------------- the parent
def build(root: Path, segments: int, pending: int, rows: int) -> None:
    """``pending`` sealed, committed batches of ``segments`` segments of ``rows`` rows each."""
    sys.path.insert(0, str(REPO))
    from tests.helpers.walfactory import WalFactory
    with WalFactory(root / "wal", checkpoint=root / "cp") as f:
        for b in range(pending):
            f.sealed(b, rows=[rows] * segments, committed=True)
    assert not os.path.exists(root / "wal" / "log" / "CURRENT"), "the template has a log"


def run_child(tree: str, template: Path, scratch: Path, profile: bool) -> dict:
    """One measurement: a copy of ``template``, measured by a fresh process on ``tree``."""
    work = scratch / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work, symlinks=True)
    env = dict(os.environ, PYTHONPATH=tree, DRIVER_CPU_TREE=tree)
    args = [sys.executable, str(Path(__file__).resolve()), "--measure", str(work)]
    if profile:
        args.append("--profile")
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tree)
    shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"measurement on {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def median_phases(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in ("open", *PHASES, "total")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--segments", default="10,100,400,1000,2000",
                   help="comma-separated segments per batch (default: 10,100,400,1000,2000)")
    p.add_argument("--pending", type=int, default=10, help="batches pending (default 10)")
    p.add_argument("--rows", type=int, default=3, help="rows a segment (default 3)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", metavar="REV", help="also measure this commit, alternating")
    p.add_argument("--old-max-segments", type=int, default=1000,
                   help="measure --old only up to this many segments (default 1000: format 1 "
                        "takes minutes of CPU at 2,000)")
    p.add_argument("--profile", action="store_true", help="print a cProfile of each size")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--measure", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.measure:
        tree = os.environ.get("DRIVER_CPU_TREE", str(REPO))
        sys.path.insert(0, tree)
        print(json.dumps(measure(args.measure, args.profile)))
        return 0

    sizes = [int(n) for n in args.segments.split(",")]
    new_rev = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    with tempfile.TemporaryDirectory(prefix="driver-cpu-") as tmp:
        tmp = Path(tmp)
        templates = {}
        for s in sizes:
            started = time.perf_counter()
            templates[s] = tmp / f"s{s}"
            build(templates[s], s, args.pending, args.rows)
            print(f"built {args.pending} pending batches of {s} segments in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
        if args.profile:
            for s in sizes:
                got = run_child(str(REPO), templates[s], tmp, profile=True)
                print(f"== {s} segments, {args.pending} pending: total {got['total']:.3f} CPU s")
                print(got["profile"])
            return 0
        old_tree = None
        if args.old:
            old_tree = tmp / "old-tree"
            git("worktree", "add", "--detach", str(old_tree), args.old)
        trees = {"new": str(REPO)}
        if old_tree is not None:
            trees["old"] = str(old_tree)
        runs: dict[str, dict[int, list[dict]]] = {k: {s: [] for s in sizes} for k in trees}
        try:
            for r in range(args.rounds):
                order = sizes if r % 2 == 0 else list(reversed(sizes))
                for s in order:
                    sides = list(trees) if r % 2 == 0 else list(reversed(list(trees)))
                    for side in sides:
                        if side == "old" and s > args.old_max_segments:
                            continue
                        got = run_child(trees[side], templates[s], tmp, profile=False)
                        assert got["segments"] == s and got["pending_before"] == args.pending
                        runs[side][s].append(got)
                        print(f"round {r + 1} {side:>3} S={s:>5}: {got['total']:.3f} CPU s",
                              file=sys.stderr)
        finally:
            if old_tree is not None:
                git("worktree", "remove", "--force", str(old_tree))

    results = {}
    print(f"\n{args.pending} batches pending, {args.rows} rows a segment, CPU s of the "
          f"driver's process for the first pending batch (median of {args.rounds})\n")
    head = "| segments | " + " | ".join(PHASES) + " | total | per segment (ms) |"
    if args.old:
        head += " old total | old/new |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in sizes:
        new = median_phases(runs["new"][s])
        row = {"new": new, "new_runs": [{k: v for k, v in g.items() if k != "profile"}
                                        for g in runs["new"][s]]}
        line = (f"| {s:,} | " + " | ".join(f"{new[p]:.3f}" for p in PHASES)
                + f" | **{new['total']:.3f}** | {new['total'] * 1e3 / s:.3f} |")
        if args.old:
            if runs["old"][s]:
                old = median_phases(runs["old"][s])
                row["old"], row["old_runs"] = old, runs["old"][s]
                row["ratio_old_over_new"] = round(old["total"] / new["total"], 1)
                line += f" {old['total']:.3f} | {row['ratio_old_over_new']}x |"
            else:
                line += " not run | |"
        results[str(s)] = row
        print(line)
    biggest = max(sizes)
    met = results[str(biggest)]["new"]["total"] <= GOAL_S
    print(f"\ngoal (at most {GOAL_S} CPU s at 2,000 segments, {args.pending} pending): "
          f"{'met' if met else 'missed'} at {biggest:,} segments "
          f"({results[str(biggest)]['new']['total']:.3f} s)")
    doc = {"command": "python " + " ".join(shlex.quote(a) for a in [
               "bench/driver_cpu.py", *(argv if argv is not None else sys.argv[1:])]),
           "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": new_rev + ("-dirty" if dirty else ""),
           "old": git("rev-parse", "--short", args.old) if args.old else None,
           "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                       "python": platform.python_version(), "loadavg": os.getloadavg()},
           "pending_batches": args.pending, "rows_per_segment": args.rows,
           "rounds": args.rounds, "old_max_segments": args.old_max_segments,
           "phases": list(PHASES), "unit": "CPU seconds (time.process_time), median",
           "goal_cpu_s": GOAL_S, "goal_met": met, "results": results}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
