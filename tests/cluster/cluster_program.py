"""The multi-executor tests' Spark query, run as a standalone driver program.

A SparkSession whose master is ``local-cluster[...]`` or a real standalone cluster cannot live
beside the test suite's ``local[2]`` session in one pytest process, so
``test_multi_executor.py`` runs this program as a subprocess (the venv's Python, its own session
and process group)::

    python tests/cluster/cluster_program.py --master 'local-cluster[2,1,1024]' \
        --keyspace ks --table events --checkpoint /tmp/w/cp --input /tmp/w/in \
        --pending /tmp/w/pending --release 0,1,2 --events /tmp/w/events.jsonl ...

The query reads JSON files one per trigger (``maxFilesPerTrigger=1``) from ``--input``. The
program *releases* the files itself: it moves ``--pending/in-NNNN.json`` into ``--input`` only
once batch N-1 is committed and flushed, so batch N is file N by construction. Between the file
source and the sink sits a ``mapInArrow`` that adds the task's partition id and attempt number
to every row (columns ``part`` and ``attempt``: the table then shows which task attempt's
segment was flushed) and injects the faults of ``--faults``, keyed ``"<batch>/<partition>/
<attempt>"``:

* ``raise``: the task's first attempt fails with a Python exception (before anything staged);
* ``exit``: the task's Python worker kills itself (``os._exit``);
* ``slow:<s>``: the task hands all but its last Arrow batch on, writes a marker file
  (``--markers/slow-b<batch>-p<part>-a<attempt>.json``, with the pids from the worker up to
  the executor JVM), then sleeps ``s`` seconds. Used to have a task running when the
  executor is killed (``--kill-executor-at-batch``) and for speculative execution.

Further faults: ``CASSANDRA_WAL_CRASH_AT=stage.after`` in the environment (executors inherit
it) kills the first task that completed its segment (``wal/crashpoints.py``);
``--crash-flush-at-batch N`` arms ``flush.before_ingest`` with ``CASSANDRA_WAL_CRASH_SCOPE=
group`` in this driver process just before releasing file N: the driver, its JVM and the
executor JVMs die right after ``commits/N`` is written, before anything of batch N is ingested.
``--crash-flush-point P`` arms point ``P`` instead, e.g. ``flush.task_written`` with
``--flush-mode executors``: the flusher hands the armed point to its Spark tasks, and the first
task of batch N whose segment is acknowledged kills its Python worker's process group (the test
then kills the whole run: the driver dies in the middle of the flush).

``--flush-mode executors`` sets ``wal.flush.mode=executors`` on the query (committed batches
are written by a Spark job of one task per segment) and logs the sink's flush lines
(``recovery.replay``, ``recovery.executors``, ``recovery.flusher``) at INFO in this program's output.

``--master standalone:2`` starts a Master and two Workers with ``spark-class`` (Workers on
127.0.0.1 and 127.0.0.2, one core each): executors on two different *hosts*. Speculative
tasks need that: Spark never launches a speculative copy on a host where the task already
has an attempt, and every executor of ``local-cluster`` is on the same host.

Events go to ``--events`` as JSON lines (flushed at once, so a SIGKILL loses none): Spark up,
files released, batches committed and flushed, every segment file name seen in the WAL (a
watcher lists ``segments/<batch>/`` every 50 ms, so losing attempts' files are seen before the
flush deletes them), slow tasks, executors killed, the crash armed.

Exit codes: 0 done (every released batch committed and flushed, query stopped); 3 the query
failed; 4 the deadline passed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

# This checkout first on the path: tests.helpers, and the sink's code beside them.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.helpers.net import free_port  # noqa: E402
from tests.helpers.spark_session import FAST_JVM, local_builder  # noqa: E402

EXIT_OK, EXIT_USAGE, EXIT_QUERY_FAILED, EXIT_DEADLINE = 0, 2, 3, 4

INPUT_SCHEMA = "id INT, batch_tag INT, payload STRING, amount BIGINT"
OUTPUT_SCHEMA = INPUT_SCHEMA + ", part INT, attempt INT"
ROWS_PER_ARROW_BATCH = 32
EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"
# Every JVM of a run (driver, executors, standalone Master and Workers): the C1 compiler only
# and a serial GC start several times cheaper on a small, busy machine. Functionally the same.


def say(msg: str) -> None:
    print(f"[cluster-driver {time.strftime('%H:%M:%S')} pid={os.getpid()}] {msg}", flush=True)


class Events:
    """Append-only JSON lines, one write per event (survives a SIGKILL of this process)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields) -> None:
        line = json.dumps(dict(ev=ev, t=time.time(), **fields), sort_keys=True) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]",
                   help="a Spark master URL, or standalone:2 (a Master and two Workers on "
                        "two loopback hosts, started here)")
    p.add_argument("--keyspace", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", required=True, help="the stream's folder")
    p.add_argument("--pending", required=True, help="where in-NNNN.json wait to be released")
    p.add_argument("--release", default="", help="batch ids to release, in order: 0,1,2")
    p.add_argument("--faults", default="{}", help='JSON {"<batch>/<part>/<attempt>": fault}')
    p.add_argument("--kill-executor-at-batch", type=int, default=None)
    p.add_argument("--crash-flush-at-batch", type=int, default=None)
    p.add_argument("--crash-flush-point", default="flush.before_ingest",
                   help="the crash point --crash-flush-at-batch arms")
    p.add_argument("--crash-once", default=None, help="once-file for the armed crash point")
    p.add_argument("--flush-mode", choices=("driver", "executors"), default="driver",
                   help="wal.flush.mode of the query")
    p.add_argument("--speculation", action="store_true")
    p.add_argument("--markers", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9042)
    p.add_argument("--deadline-s", type=float, default=600.0)
    p.add_argument("--trigger-ms", type=int, default=200)
    return p.parse_args(argv)


# -- processes ---------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str]:
    """(parent pid, first argv words) of a live process."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    return ppid, cmd


def pid_chain(pid: int, depth: int = 8) -> list[dict]:
    """``pid`` and its ancestors: [{"pid", "ppid", "executor"}...] up to and including the
    executor JVM (a process whose command line names CoarseGrainedExecutorBackend)."""
    out = []
    for _ in range(depth):
        try:
            ppid, cmd = _stat(pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        is_exec = EXECUTOR_MAIN in cmd
        out.append({"pid": pid, "ppid": ppid, "executor": is_exec})
        if is_exec or ppid <= 1:
            break
        pid = ppid
    return out


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid, _ = _stat(int(name))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def executor_jvms_of_this_run() -> set[int]:
    """Executor JVMs (``pgrep -f CoarseGrainedExecutorBackend``) that descend from this program
    (``local-cluster``: children of the driver JVM; standalone: of the Workers started here)."""
    found = subprocess.run(["pgrep", "-f", EXECUTOR_MAIN], capture_output=True, text=True)
    pids = {int(x) for x in found.stdout.split()}
    return pids & descendants(os.getpid())


# -- a standalone cluster on two loopback hosts -------------------------------------------------
class StandaloneCluster:
    HOSTS = ("127.0.0.1", "127.0.0.2")

    def __init__(self, workdir: str, workers: int):
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.workdir = workdir
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.workers = workers

    def _spawn(self, name: str, args: list[str]) -> None:
        env = dict(os.environ, SPARK_HOME=self.home, SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
                   SPARK_LOG_DIR=os.path.join(self.workdir, "logs"))
        log = open(os.path.join(self.workdir, f"{name}.log"), "ab")
        self.procs.append(subprocess.Popen([os.path.join(self.home, "bin", "spark-class")] + args,
                                           stdout=log, stderr=subprocess.STDOUT, env=env,
                                           stdin=subprocess.DEVNULL))

    def start(self) -> "StandaloneCluster":
        os.makedirs(self.workdir, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", "0"])
        for i in range(self.workers):
            host = self.HOSTS[i % len(self.HOSTS)]
            self._spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                                       "--cores", "1", "--memory", "1g", "--webui-port", "0",
                                       "--work-dir", os.path.join(self.workdir, f"work{i}"),
                                       self.url])
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        until = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


# -- the executor side -------------------------------------------------------------------------
def make_injector(faults: dict, markers: str):
    """The ``mapInArrow`` function: tags rows with (partition, attempt), injects faults."""

    def inject(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch = int(tc.getLocalProperty("streaming.sql.batchId") or -1)
        part, attempt = tc.partitionId(), tc.attemptNumber()
        fault = faults.get(f"{batch}/{part}/{attempt}", "")
        if fault == "raise":
            raise RuntimeError(f"injected failure: batch {batch} partition {part} "
                               f"attempt {attempt}")
        if fault == "exit":
            os._exit(17)
        sleep_s = float(fault.split(":", 1)[1]) if fault.startswith("slow:") else None

        def tagged(rb):
            n = rb.num_rows
            return pa.RecordBatch.from_arrays(
                list(rb.columns) + [pa.array([part] * n, pa.int32()),
                                    pa.array([attempt] * n, pa.int32())],
                names=list(rb.schema.names) + ["part", "attempt"])

        held = None
        for rb in batches:
            if held is not None:
                yield tagged(held)
            held = rb
        if sleep_s is not None:
            # Everything but the last Arrow batch is on its way to the sink's writer (as far as
            # Spark's buffers let it through): the task is mid-staging when it stalls.
            marker = os.path.join(markers, f"slow-b{batch}-p{part}-a{attempt}.json")
            with open(marker + ".tmp", "w") as f:
                json.dump({"batch": batch, "partition": part, "attempt": attempt,
                           "chain": pid_chain(os.getpid()), "at": time.time()}, f)
            os.replace(marker + ".tmp", marker)
            time.sleep(sleep_s)
        if held is not None:
            yield tagged(held)

    return inject


# -- the driver side ---------------------------------------------------------------------------
class Watcher(threading.Thread):
    """Records every segment file name of the WAL and acts on slow-task markers."""

    def __init__(self, events: Events, checkpoint: str, markers: str,
                 kill_at_batch: int | None):
        super().__init__(name="cluster-watcher", daemon=True)
        self.events, self.checkpoint, self.markers = events, checkpoint, markers
        self.kill_at_batch = kill_at_batch
        self.seen: set[str] = set()
        self.markers_seen: set[str] = set()
        self.stop_event = threading.Event()

    def _segments(self) -> None:
        from wal.pointer import read_pointer

        root = read_pointer(self.checkpoint)
        if root is None:
            return
        seg_root = os.path.join(root, "segments")
        try:
            batches = os.listdir(seg_root)
        except FileNotFoundError:
            return
        for b in batches:
            try:
                names = os.listdir(os.path.join(seg_root, b))
            except FileNotFoundError:
                continue
            for n in names:
                key = f"{b}/{n}"
                if key not in self.seen:
                    self.seen.add(key)
                    self.events("segment", batch=int(b), name=n,
                                rows=self._rows(os.path.join(seg_root, b, n)))

    @staticmethod
    def _rows(path: str) -> int | None:
        """Rows of a complete segment (verified), None for a .tmp or a file already gone."""
        from wal.segment import SegmentReader

        if not path.endswith(".seg"):
            return None
        try:
            return SegmentReader(path).verify()[0]
        except Exception:  # noqa: BLE001 - deleted by the flush meanwhile
            return None

    def _slow_markers(self) -> None:
        try:
            names = os.listdir(self.markers)
        except FileNotFoundError:
            return
        for n in names:
            if not n.endswith(".json") or n in self.markers_seen:
                continue
            self.markers_seen.add(n)
            with open(os.path.join(self.markers, n)) as f:
                info = json.load(f)
            self.events("slow_task", **info)
            if info["batch"] == self.kill_at_batch:
                self._kill_executor(info)

    def _kill_executor(self, info: dict) -> None:
        jvm = next((p["pid"] for p in info["chain"] if p["executor"]), None)
        ours = executor_jvms_of_this_run()
        if jvm is None or jvm not in ours:
            self.events("kill_refused", jvm=jvm, ours=sorted(ours))
            say(f"not killing {jvm}: not an executor JVM of this run ({sorted(ours)})")
            return
        os.kill(jvm, signal.SIGKILL)
        self.events("executor_killed", pid=jvm, batch=info["batch"],
                    partition=info["partition"], attempt=info["attempt"],
                    executors_before=sorted(ours))
        say(f"SIGKILLed executor JVM {jvm} running batch {info['batch']} "
            f"partition {info['partition']} attempt {info['attempt']}")

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._segments()
                self._slow_markers()
            except Exception as exc:  # noqa: BLE001 - a watcher must not die; report it
                self.events("watcher_error", error=repr(exc))
            self.stop_event.wait(0.05)


def release(pending: str, folder: str, batch: int) -> None:
    name = f"in-{batch:04d}.json"
    src = os.path.join(pending, name)
    # The same filesystem: a rename, so the file source never sees half a file.
    os.replace(src, os.path.join(folder, name))


def main(argv=None) -> int:
    args = parse_args(argv)
    faults = json.loads(args.faults)
    to_release = [int(x) for x in args.release.split(",") if x.strip()]
    missing = [b for b in to_release
               if not os.path.exists(os.path.join(args.pending, f"in-{b:04d}.json"))]
    if missing:
        say(f"nothing to release for batches {missing} in {args.pending}")
        return EXIT_USAGE
    os.makedirs(args.input, exist_ok=True)
    os.makedirs(args.markers, exist_ok=True)
    events = Events(args.events)
    if args.flush_mode == "executors":
        import logging

        logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        for name in ("recovery.replay", "recovery.executors", "recovery.flusher"):
            logging.getLogger(name).setLevel(logging.INFO)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.monotonic()
    deadline = started + args.deadline_s
    events("start", pid=os.getpid(), pgid=os.getpgrp(), master=args.master,
           release=to_release, faults=faults, crash_at=os.environ.get("CASSANDRA_WAL_CRASH_AT"))
    say(f"start: master {args.master}, release {to_release}, faults {faults}, "
        f"crash point {os.environ.get('CASSANDRA_WAL_CRASH_AT') or '-'}")

    cluster = None
    master = args.master
    if master.startswith("standalone:"):
        cluster = StandaloneCluster(os.path.join(os.path.dirname(args.events), "standalone"),
                                    int(master.split(":", 1)[1])).start()
        master = cluster.url

    import sinks
    from wal import checkpoint as ckpt
    from wal.layout import WalDir

    sizes = [os.path.getsize(os.path.join(d, n)) for d in (args.pending, args.input)
             for n in os.listdir(d) if n.endswith(".json")]
    split = max(sizes) // 2 + 1           # two tasks per batch
    builder = (local_builder("cassandra-wal-cluster-driver", master)
               .config("spark.task.maxFailures", "4")
               .config("spark.sql.files.maxPartitionBytes", str(split))
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ROWS_PER_ARROW_BATCH))
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
               # Smaller JVM -> Python buffers (default 64 KiB): a stalled task's first rows
               # reach the sink's writer, so it dies or loses *mid-staging*.
               .config("spark.buffer.size", "8192"))
    if args.speculation:
        builder = (builder.config("spark.speculation", "true")
                   .config("spark.speculation.multiplier", "1")
                   .config("spark.speculation.quantile", "0.5")
                   .config("spark.speculation.minTaskRuntime", "1s"))
    try:
        spark = builder.getOrCreate()
    except Exception:
        if cluster is not None:
            cluster.stop()
        raise
    sc = spark.sparkContext
    sc.setLogLevel("WARN")
    jvm = sc._jvm
    # "Marking task ... as speculatable", "Killing attempt 0 ... as the attempt 1 succeeded",
    # "Lost task ...": the scheduler's own account of what happened, in this program's log.
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.INFO)
    registry = sinks.register(spark)
    events("spark_up", master=sc.master, seconds=time.monotonic() - started)
    say(f"spark up ({sc.master}) in {time.monotonic() - started:.1f}s")

    stream = (spark.readStream.schema(INPUT_SCHEMA)
              .option("maxFilesPerTrigger", 1)
              .json(args.input)
              .mapInArrow(make_injector(faults, args.markers), OUTPUT_SCHEMA))
    query = (stream.writeStream.format("cassandra_wal")
             .option("keyspace", args.keyspace)
             .option("table", args.table)
             .option("checkpointLocation", args.checkpoint)
             .option("spark.cassandra.connection.host", args.host)
             .option("spark.cassandra.connection.port", str(args.port))
             .option("wal.flush.mode", args.flush_mode)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds")
             .start())
    events("query_started", id=str(query.id))
    watcher = Watcher(events, args.checkpoint, args.markers, args.kill_executor_at_batch)
    watcher.start()

    def wal() -> WalDir | None:
        from wal.pointer import read_pointer

        root = read_pointer(args.checkpoint)
        return WalDir(root) if root else None

    def wait_flushed(batch: int) -> int | None:
        """Wait for commits/batch and the WAL's flushed_through >= batch; None, or an exit code."""
        committed_said = False
        while time.monotonic() < deadline:
            if not query.isActive:
                say(f"query terminated: {query.exception()}")
                events("query_failed", error=str(query.exception()))
                return EXIT_QUERY_FAILED
            if not committed_said and ckpt.is_committed(args.checkpoint, batch):
                events("committed", batch=batch)
                committed_said = True
            w = wal()
            if committed_said and w is not None and w.read_flushed_through() >= batch:
                events("flushed", batch=batch)
                return None
            time.sleep(0.1)
        say(f"deadline of {args.deadline_s}s passed waiting for batch {batch}")
        events("deadline", batch=batch)
        return EXIT_DEADLINE

    code = EXIT_OK
    # A restart first finishes what recovery replays (onQueryStarted ran it synchronously).
    previous = ckpt.committed_batches(args.checkpoint)
    for batch in to_release:
        if previous and batch != previous[-1] + 1 and batch not in previous:
            say(f"batch {batch} would not be file {batch}: committed so far {previous}")
            code = EXIT_USAGE
            break
        if batch == args.crash_flush_at_batch:
            os.environ["CASSANDRA_WAL_CRASH_AT"] = args.crash_flush_point
            os.environ["CASSANDRA_WAL_CRASH_SCOPE"] = "group"
            if args.crash_once:
                os.environ["CASSANDRA_WAL_CRASH_ONCE"] = args.crash_once
            events("crash_armed", batch=batch, point=args.crash_flush_point)
            say(f"armed {args.crash_flush_point} (scope group) for batch {batch}")
        release(args.pending, args.input, batch)
        events("released", batch=batch)
        say(f"released file {batch}")
        code = wait_flushed(batch) or EXIT_OK
        if code != EXIT_OK:
            break
        say(f"batch {batch} committed and flushed")
        previous = ckpt.committed_batches(args.checkpoint)

    if code == EXIT_OK:
        query.stop()
        until = time.monotonic() + 60
        while registry.flushers and time.monotonic() < until:
            time.sleep(0.1)
        events("done", seconds=time.monotonic() - started, flushers_left=list(registry.flushers))
        say(f"done in {time.monotonic() - started:.1f}s")
    watcher.stop_event.set()
    watcher.join(timeout=5)
    watcher._segments()
    try:
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
