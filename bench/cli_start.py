"""How long ``cassandra-wal`` takes to start: ``--help``, ``--version`` and ``inspect`` of a small
WAL, as a shell runs them (the venv's console script, a new process each time).

The commands alternate, one run of each per round, so that a busy moment of the (shared)
machine hits all of them alike; reported: the median, min and max wall time of each over the
rounds. ``python -c pass`` (the interpreter alone) is measured beside them as the baseline, and
``python -c 'import pyspark'`` as what importing Spark would add. Each command is also run
once with ``-X importtime`` to record whether it imported pyspark (``inspect``, ``dump`` and
``verify`` must not: ``tests/unit/test_architecture.py``).

The WAL: 3 flushed batches of 2 partitions (5 rows each), built through the real ``wal`` API
(``tests/helpers/walfactory.py``) in a temp folder. No node needed.

    .venv/bin/python bench/cli_start.py [--rounds N] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.helpers.walfactory import WalFactory  # noqa: E402

OUT = REPO / "bench" / "results" / "cli_start.json"


def commands(wal: str) -> dict[str, list[str]]:
    bindir = Path(sys.executable).parent
    cli, py = str(bindir / "cassandra-wal"), sys.executable
    return {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import pyspark'": [py, "-c", "import pyspark"],
        "cassandra-wal --help": [cli, "--help"],
        "cassandra-wal --version": [cli, "--version"],
        "cassandra-wal inspect WAL": [cli, "inspect", wal],
        "cassandra-wal inspect WAL --json": [cli, "inspect", wal, "--json"],
    }


def once(cmd: list[str], env: dict, cwd: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          cwd=cwd)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} exited {done.returncode}: {done.stderr.decode()}")
    return took


def imports_pyspark(cmd: list[str], env: dict, cwd: str) -> bool:
    """Whether ``cmd`` (a console script or python) imports pyspark, by ``-X importtime``."""
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                          env=dict(env, PYTHONPROFILEIMPORTTIME="1"), text=True)
    return any(line.rsplit("|", 1)[-1].strip().split(".")[0] == "pyspark"
               for line in done.stderr.splitlines() if line.startswith("import time:"))


def machine() -> dict:
    cpu = ""
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), "")
    from importlib.metadata import version
    return {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "loadavg_1_5_15_at_start": list(os.getloadavg()),
            "versions": {"python": platform.python_version(),
                         **{d: version(d) for d in ("pyspark", "pyarrow", "rocksdict",
                                                    "cassandra-driver", "cassandra-wal-sink")}}}


def git_head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return done.stdout.strip() + (" (with uncommitted changes in the tree)" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command (15)")
    parser.add_argument("--out", default=str(OUT), help=f"JSON results (default {OUT})")
    args = parser.parse_args(argv)

    started = dt.datetime.now(dt.timezone.utc)
    info = machine()
    with tempfile.TemporaryDirectory(prefix="cli-start-") as tmp:
        wal = os.path.join(tmp, "wal")
        with WalFactory(wal, checkpoint=os.path.join(tmp, "cp")) as f:
            for batch in range(3):
                f.flushed(batch)
        # As a shell runs them: from elsewhere, the repository not on the path.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        cmds = commands(wal)
        for cmd in cmds.values():                     # warm the page cache, check they run
            once(cmd, env, tmp)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.rounds):
            for name, cmd in cmds.items():
                times[name].append(once(cmd, env, tmp))
        pyspark_imported = {name: imports_pyspark(cmd, env, tmp) for name, cmd in cmds.items()}

    results = {name: {"median_s": round(statistics.median(t), 4), "min_s": round(min(t), 4),
                      "max_s": round(max(t), 4), "imports_pyspark": pyspark_imported[name],
                      "runs_s": [round(x, 4) for x in t]}
               for name, t in times.items()}
    doc = {"command": shlex.join(["python", "bench/cli_start.py", *(argv or sys.argv[1:])]),
           "date_utc": started.strftime("%Y-%m-%d %H:%M"), "commit": git_head(),
           "rounds": args.rounds, "wal": "3 flushed batches x 2 partitions (3 + 2 rows)",
           "machine": info, "results": results}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")

    print(f"| command ({args.rounds} runs each) | median s | min s | max s | imports pyspark |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| `{name}` | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
              f"{'yes' if r['imports_pyspark'] else 'no'} |")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
