"""The crash tests' Spark query: a file stream written through the ``cassandra_wal`` sink.

Run by ``tests/crash/harness.py`` with the project's interpreter, in its own session (so that
``CASSANDRA_WAL_CRASH_SCOPE=group`` or the harness can kill the driver, its JVM and every
Python worker at once)::

    python tests/crash/driver_program.py --keyspace ks --table events \
        --checkpoint /tmp/cp --input /tmp/in --host 127.0.0.1 --port 9042 --deadline-s 120

The checkpoint may be on a store (``hdfs://...``, ``s3a://...``; ``tests/crash/storage.py``):
``--conf key=value`` (repeatable) goes to the SparkSession builder, e.g.
``--conf spark.hadoop.dfs.namenode.http-address=127.0.0.1:9870``; the sink and this program
then reach the store as the session says. The input files stay on the local disk.

It reads the JSON files of ``--input`` one file per micro-batch (``maxFilesPerTrigger=1``),
writes them with ``format("cassandra_wal")`` and runs until every input file is in a committed
batch **and** the WAL has nothing pending (every batch's recovery action is "nothing"); then it
stops the query cleanly and exits 0.

Batch N is file N only in a run that started on an empty checkpoint: the file source records
file K in its log (``sources/0/K``) *before* the batch that reads it is planned
(``offsets/N``), so after a crash between the two, the re-planned batch reads every file
recorded since the previous batch (two files, say). :func:`files_by_batch` reads Spark's own
record of which files each batch read; the harness uses it too.

Exit codes: 0 done; 3 the query failed; 4 the deadline passed first; 2 bad arguments.
Progress goes to stdout, one ``[driver]`` line per event, for the harness's log.

Process groups (measured with pyspark 4.3.0): the program runs in a session of its own (the
harness starts it so) and the JVM is in its process group. Every Python worker, though, is
forked by one of Spark's Python daemons, one per worker module (``pyspark.worker`` for the
tasks' ``write()``, ``pyspark.sql.worker.python_streaming_sink_runner`` for ``commit()``,
...), and each daemon puts itself and its workers in a process group of their own
(``os.setpgid(0, 0)`` in ``pyspark/daemon.py``); workers are reused from batch to batch, so
``commit.after_seal@2`` is the second commit one worker runs. A crash point with
``CASSANDRA_WAL_CRASH_SCOPE=group`` reached in ``write()`` or ``commit()`` therefore kills
that daemon's group only. The harness completes the "driver machine died" picture: it kills
every process of the run (found by an environment token) the moment the crash point fires.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import time

# This checkout first on the path: tests.helpers, and the sink's code beside them.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.helpers.spark_session import local_builder  # noqa: E402

from wal import checkpoint as ckpt
from wal.recovery_policy import RecoveryPolicy

EXIT_OK, EXIT_USAGE, EXIT_QUERY_FAILED, EXIT_DEADLINE = 0, 2, 3, 4

SCHEMA_DDL = "id INT, batch_tag INT, payload STRING, amount BIGINT"
#: ``--changes``: each line also says its operation and its place in the source's order.
CHANGES_DDL = SCHEMA_DDL + ", op STRING, lsn BIGINT"
#: ``--changes``: the completeness marker's table, made by the sink in the target's keyspace.
MARKER_TABLE = "crash_progress"
ROWS_PER_ARROW_BATCH = 32     # several chunks per segment: "flush.mid" has rows on both sides
POLL_S = 0.2


def say(msg: str) -> None:
    print(f"[driver {time.strftime('%H:%M:%S')} pid={os.getpid()}] {msg}", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keyspace", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", required=True, help="folder of *.json files, one per batch")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9042)
    p.add_argument("--deadline-s", type=float, default=180.0)
    p.add_argument("--trigger-ms", type=int, default=200)
    p.add_argument("--consistency", default="ONE")
    p.add_argument("--flush-mode", default="driver", help="wal.flush.mode")
    p.add_argument("--changes", action="store_true",
                   help="a change stream: op.column=op, writetime=lsn, and the marker table "
                        f"{MARKER_TABLE} (marker.create=true)")
    p.add_argument("--change-order", choices=("lsn", "sealed"), default="lsn",
                   help="with --changes: lsn, writetime=lsn and any partitioning; sealed, no "
                        "writetime and each batch one task (coalesce(1)), so that the sealed "
                        "order is the source's")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session (repeatable)")
    args = p.parse_args(argv)
    for item in args.conf:
        if "=" not in item:
            p.error(f"--conf {item!r}: expected KEY=VALUE")
    return args


def input_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "*.json")))


def files_by_batch(checkpoint: str, _cache: dict | None = None) -> dict[int, list[str]]:
    """Input file names (base names) each planned batch reads, from Spark's checkpoint (a
    local folder or a store's URI, read through :func:`wal.checkpoint.open_checkpoint`).

    ``offsets/N`` ends with the file source's offset, ``{"logOffset": K}``: batch N reads the
    entries of the source log ``sources/0/<k>`` for k after the previous batch's offset up to
    K. Both are written whole (temp file, rename) and never change, so ``_cache`` may keep
    them between calls. The source log is never compacted here (the program sets
    ``spark.sql.streaming.fileSource.log.compactInterval`` high).
    """
    cache = _cache if _cache is not None else {}
    store = ckpt.open_checkpoint(checkpoint).store

    def parsed(kind: str, name: str):
        key = f"{kind}/{name}"
        if key not in cache:
            raw = store.read(key)
            if raw is None:
                raise FileNotFoundError(f"{checkpoint}: {key} listed but gone")
            lines = raw.decode().splitlines()
            if kind == "offsets":
                cache[key] = json.loads(lines[-1])["logOffset"]
            else:
                cache[key] = [os.path.basename(json.loads(line)["path"])
                              for line in lines[1:] if line.strip()]
        return cache[key]

    def listing(kind: str) -> list[int]:
        names = (key.rsplit("/", 1)[-1] for key in store.list(kind))
        return sorted(int(n) for n in names if n.isdigit())

    out, previous = {}, -1
    for batch in listing("offsets"):
        last = parsed("offsets", str(batch))
        out[batch] = [name for k in range(previous + 1, last + 1)
                      for name in parsed("sources/0", str(k))]
        previous = last
    return out


def committed_files(checkpoint: str, _cache: dict | None = None) -> set[str]:
    """Base names of the input files read by batches Spark has committed (``commits/N``)."""
    committed = ckpt.committed_batches(checkpoint)
    by_batch = files_by_batch(checkpoint, _cache)
    return {name for b in committed for name in by_batch.get(b, [])}


def wal_pending(checkpoint: str) -> list[str] | None:
    """What the WAL still has to do, as "batch:action" strings ([] nothing; None: no WAL yet).

    Read through a RocksDB secondary instance beside the flusher, the live writer. A WAL on a
    store is read in this host's working copy, the flusher's, as it is (nothing pulled: the
    flusher pulls before it flushes, and Spark's ``commits/N`` beyond what it flushed count
    as pending anyway)."""
    from wal import catalog
    from wal.catalog import RecoveryAction
    from wal.format import MARKER_FILE
    from wal.layout import WalDir
    from wal.pointer import read_pointer
    from wal.remote import working_copy_of
    from wal.schemes import is_remote

    root = read_pointer(checkpoint)
    if root is not None and is_remote(root):
        root = working_copy_of(root)
        if not os.path.exists(os.path.join(root, MARKER_FILE)):
            return None
    if root is None or not os.path.isdir(root):
        return None
    wal = WalDir(root)
    views = catalog.describe_read_only(wal, checkpoint, RecoveryPolicy.QUERY_FLUSHER)
    return [f"{v.batch}:{v.action}" for v in views if v.action != RecoveryAction.NOTHING]


def main(argv=None) -> int:
    args = parse_args(argv)
    files = input_files(args.input)
    if not files:
        say(f"no *.json in {args.input}")
        return EXIT_USAGE
    expected = {os.path.basename(f) for f in files}
    # The sink's own account (discarded, replayed, flushed batches) in the run's log.
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format="[%(name)s %(asctime)s] %(levelname)s %(message)s")
    for name in ("sinks", "recovery", "wal"):
        logging.getLogger(name).setLevel(logging.INFO)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    crash = os.environ.get("CASSANDRA_WAL_CRASH_AT")
    say(f"start: {len(files)} input files, checkpoint {args.checkpoint}, "
        f"crash point {crash or '-'}, pgid {os.getpgrp()}, "
        f"conf {[c.partition('=')[0] for c in args.conf]}")

    import sinks

    # Two splits per file (two tasks, two segments per batch), several chunks per segment.
    split = max(os.path.getsize(f) for f in files) // 2 + 1
    started = time.monotonic()
    builder = (local_builder("cassandra-wal-crash-driver")
               .config("spark.sql.files.maxPartitionBytes", str(split))
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ROWS_PER_ARROW_BATCH))
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
               .config("spark.sql.streaming.fileSource.log.compactInterval", "1000000"))
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    registry = sinks.register(spark)
    say(f"spark up in {time.monotonic() - started:.1f}s")

    stream = (spark.readStream.schema(CHANGES_DDL if args.changes else SCHEMA_DDL)
              .option("maxFilesPerTrigger", 1)
              .json(args.input))
    changes = ({"op.column": "op", "writetime": "lsn", "marker.table": MARKER_TABLE,
                "marker.create": "true"} if args.changes else {})
    if args.changes and args.change_order == "sealed":
        del changes["writetime"]
        stream = stream.drop("lsn").coalesce(1)
    query = (stream.writeStream.format("cassandra_wal").options(**changes)
             .option("keyspace", args.keyspace)
             .option("table", args.table)
             .option("checkpointLocation", args.checkpoint)
             .option("spark.cassandra.connection.host", args.host)
             .option("spark.cassandra.connection.port", str(args.port))
             .option("spark.cassandra.output.consistency.level", args.consistency)
             .option("wal.flush.mode", args.flush_mode)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds")
             .start())
    say(f"query started (id {query.id}); recovery ran in onQueryStarted")

    deadline = started + args.deadline_s
    last_said = None
    code = EXIT_DEADLINE
    cache: dict = {}
    while time.monotonic() < deadline:
        if not query.isActive:
            say(f"query terminated: {query.exception()}")
            code = EXIT_QUERY_FAILED
            break
        done = committed_files(args.checkpoint, cache) & expected
        pending = wal_pending(args.checkpoint) if done == expected else ["?"]
        flushers = [f for run in registry.flushers.values() for f in run.values()]
        errors = [repr(f.last_error) for f in flushers if f.last_error is not None]
        batches = len(ckpt.committed_batches(args.checkpoint))
        state = (len(done), batches, tuple(pending or ()), tuple(errors))
        if state != last_said:
            say(f"committed {batches} batches, {len(done)}/{len(expected)} files; "
                f"WAL pending {pending}, flusher errors {errors}")
            last_said = state
        if done == expected and pending == []:
            code = EXIT_OK
            break
        time.sleep(POLL_S)
    else:
        say(f"deadline of {args.deadline_s}s passed")

    if code == EXIT_OK:
        query.stop()
        # onQueryTerminated (listener bus) drains and closes the flusher: let it finish.
        until = time.monotonic() + 30
        while registry.flushers and time.monotonic() < until:
            time.sleep(0.1)
        say(f"done in {time.monotonic() - started:.1f}s; flushers left {list(registry.flushers)}")
    spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
