"""examples/run_demo.py end to end, as the README runs it: the flights stream into Cassandra,
a SIGKILL of the whole Spark process tree part-way, a restart on the same checkpoints, and
every check against pandas passing. Against the session's node, on a small subset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "examples" / "run_demo.py"
ROWS = 20000


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry}: {cmdline[:200]}")
    return found


def test_flights_demo_survives_a_sigkill(cassandra_node, keyspace, tmp_path):
    work = tmp_path / "work"
    env = dict(os.environ, CASSANDRA_HOST=cassandra_node.host,
               CASSANDRA_PORT=str(cassandra_node.port), PYSPARK_PYTHON=sys.executable)
    # 20,000 flights in 8 files, 2 per micro-batch: 4 batches; killed once 2 are committed
    # and 1 is flushed.
    cmd = [sys.executable, str(DEMO), "--rows", str(ROWS), "--files", "8",
           "--kill-after-batches", "2", "--keyspace", keyspace, "--work", str(work)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)      # the demo then kills its Spark tree and exits
        out, _ = proc.communicate(timeout=90)
        pytest.fail(f"the demo did not finish in time:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-8000:]
    assert "SIGKILL to the stream" in out, out
    assert "[FAILED]" not in out, out
    for line in ("from an uncommitted batch",
                 "[ok] the restarted stream ran to the end (exit 0)",
                 f"[ok] rows: {ROWS:,} in Cassandra, {ROWS:,} in the source",
                 "[ok] keys (carrier, flight, time_hour, origin): 0 extra, 0 missing",
                 "[ok] every value of every flight equals the source",
                 "[ok] flights per carrier and day: 0 differ",
                 "[ok] dep_delay_avg per carrier and day: 0 differ",
                 "RESULT: every check passed"):
        assert line in out, f"{line!r} missing from:\n{out}"
    assert "0 from an uncommitted batch" in out, out
    # cassandra-wal inspect of both WALs: after the crash, then at the end, all flushed
    assert out.count("$ cassandra-wal inspect") == 4, out
    final = out.split("== The write-ahead logs", 1)[1]
    assert final.count("rows pending  0") == 2, final
    assert not _processes_mentioning(str(work)), _processes_mentioning(str(work))


def test_the_change_stream_example_ends_equal_to_its_source(cassandra_node, keyspace, tmp_path):
    """examples/flights_changes.py as the user guide runs it: flights created, revised and
    cancelled, applied through the sink, and a reader that waits on the completeness marker
    finds the table equal to the source."""
    env = dict(os.environ, CASSANDRA_HOST=cassandra_node.host,
               CASSANDRA_PORT=str(cassandra_node.port), PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(REPO_ROOT / "examples" / "flights_changes.py"),
           "--work", str(tmp_path / "work"), "--flights", "2000", "--keyspace", keyspace]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "marker: batch 2 complete" in out, out[-4000:]
    assert ("Cassandra holds 1,900 flights; the source 1,900 (2,000 created, 400 revised, "
            "100 cancelled)") in out, out[-4000:]
    assert "[ok] the table equals the source applied in order" in out
