"""Shared helpers for the sink's end-to-end tests (real Spark, real Cassandra).

Used by ``test_sink_*.py`` in this folder (pytest puts this folder on ``sys.path``)::

    from sinkutil import sink_options, wait_for, read_table, write_json_files, ...

Nothing here knows the sink's internals beyond what its users and operators see: options,
the checkpoint's ``commits/N`` files, the WAL directory (``wal/FORMAT.md``) and Cassandra.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

import sinks
from tests.helpers.net import free_port  # noqa: F401  (the tests import it from here)
from wal import checkpoint as ckpt
from wal.layout import WalDir
from wal.log import WalLog
from wal.segment import decode_chunk

#: Generous: the test machine is shared (2 cores) and every Spark batch starts Python workers.
DEFAULT_TIMEOUT = 180.0

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The offline tool, ``cassandra-wal``, run with this interpreter.
CASSANDRA_WAL = [sys.executable, "-m", "recovery.cli.main"]

#: First modification time given to input files; file k gets BASE_MTIME + k, so Spark's file
#: source (oldest first, ``maxFilesPerTrigger``) takes them in order.
BASE_MTIME = 1_700_000_000


# ------------------------------------------------------------------------------- options
def sink_options(node, keyspace: str, table: str, checkpoint: str | os.PathLike | None = None,
                 **extra: str) -> dict[str, str]:
    """Options for ``.options(**...)``: the target table and how to reach ``node``."""
    opts = {"keyspace": keyspace, "table": table,
            "spark.cassandra.connection.host": node.host,
            "spark.cassandra.connection.port": str(node.port)}
    if checkpoint is not None:
        opts["checkpointLocation"] = str(checkpoint)
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def connection_options(node) -> dict[str, str]:
    return {"spark.cassandra.connection.host": node.host,
            "spark.cassandra.connection.port": str(node.port)}


def register(spark):
    """``sinks.register`` (idempotent per session); returns the session's FlushRegistry."""
    return sinks.register(spark)


# ------------------------------------------------------------------------------- waiting
def wait_for(predicate: Callable[[], Any], timeout: float = DEFAULT_TIMEOUT,
             interval: float = 0.2, what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy and return its value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report at the end
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


# ------------------------------------------------------------------------------- Cassandra
def create_table(cql, keyspace: str, ddl: str) -> None:
    """``ddl`` is the part after ``CREATE TABLE <keyspace>.``."""
    cql.execute(f"CREATE TABLE {keyspace}.{ddl}")


def read_table(cql, keyspace: str, table: str, columns: str = "*") -> list[dict]:
    """Every row as a dict, sorted by the repr of its values (stable, key-first)."""
    rows = cql.execute(f"SELECT {columns} FROM {keyspace}.{table}")
    out = [dict(r._asdict()) for r in rows]
    return sorted(out, key=lambda r: repr(list(r.values())))


def rows_by_key(rows: Iterable[dict], *key: str) -> dict:
    out = {}
    for r in rows:
        k = tuple(r[c] for c in key)
        out[k[0] if len(k) == 1 else k] = r
    return out


def count_rows(cql, keyspace: str, table: str) -> int:
    return len(list(cql.execute(f"SELECT * FROM {keyspace}.{table}")))


def plain(value: Any) -> Any:
    """A cassandra-driver value as a plain Python value: SortedSet -> set, maps -> dict,
    ``cassandra.util.Date`` -> ``datetime.date``, UDT values (named tuples) and tuples ->
    tuples; containers recursively."""
    from cassandra.util import Date, OrderedMap, SortedSet

    if isinstance(value, SortedSet):
        return {plain(v) for v in value}
    if isinstance(value, (OrderedMap, dict)):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, Date):
        return value.date()
    return value


def _same(got: Any, expected: Any) -> bool:
    got = plain(got)
    if type(got) is not type(expected):   # True == 1, 1 == 1.0, Decimal("1") == 1 ...
        return False
    if isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(_same(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_same(got[k], v) for k, v in expected.items())
    if isinstance(expected, float) and expected != expected:  # NaN
        return got != got
    return got == expected


def assert_rows_equal(actual: dict, expected: dict, what: str = "table") -> None:
    """``actual`` and ``expected`` map a key to a row dict. Same keys; in every expected row,
    every column equal in value and type (after :func:`plain`)."""
    missing = sorted(set(expected) - set(actual), key=repr)
    extra = sorted(set(actual) - set(expected), key=repr)
    assert not missing and not extra, (f"{what}: keys missing {missing[:10]}, "
                                       f"unexpected {extra[:10]}")
    for key in sorted(expected, key=repr):
        exp, got = expected[key], actual[key]
        for column, value in exp.items():
            assert column in got, f"{what}: row {key!r} has no column {column!r}"
            assert _same(got[column], value), (
                f"{what}: row {key!r} column {column!r}: got {got[column]!r}, "
                f"expected {value!r}")


# ------------------------------------------------------------------------------- input files
def start_file_stream(spark, node, keyspace: str, table: str, src: str | os.PathLike,
                      checkpoint: str | os.PathLike, schema: str, **extra: str):
    """A stream of the JSON files in ``src`` (of ``schema``), one file a micro-batch
    (``maxFilesPerTrigger=1``, a 500 ms trigger), into ``keyspace.table`` on ``node``
    through the sink: with :func:`write_json_files`, batch k is file k."""
    register(spark)
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(src))
    return (stream.writeStream.format("cassandra_wal")
            .options(**sink_options(node, keyspace, table, checkpoint, **extra))
            .trigger(processingTime="500 milliseconds").start())


#: The events table most end-to-end tests stream into, and the schema of its JSON files.
EVENTS_TABLE = "events (id int PRIMARY KEY, file int, name text)"
EVENTS_SCHEMA = "id INT, file INT, name STRING"


def event_rows(k: int, n: int, stride: int) -> list[dict]:
    """File ``k`` of an events stream: ``n`` rows with ids ``k * stride + i`` (so a row's id
    tells its batch: one file is one micro-batch)."""
    return [{"id": k * stride + i, "file": k, "name": f"row {i} of file {k}"} for i in range(n)]


def start_events_stream(spark, node, keyspace: str, src: str | os.PathLike,
                        checkpoint: str | os.PathLike, **extra: str):
    """:func:`start_file_stream` of :data:`EVENTS_SCHEMA` files into ``keyspace.events``."""
    return start_file_stream(spark, node, keyspace, "events", src, checkpoint, EVENTS_SCHEMA,
                             **extra)


def write_json_files(folder: str | os.PathLike, files: Sequence[Sequence[dict]],
                     first_index: int = 0) -> list[Path]:
    """Write ``files[i]`` as JSON lines to ``folder/in-<first_index+i>.json``, atomically
    (a temp name outside Spark's view, then rename) with increasing modification times."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / (folder.name + ".staging")
    staging.mkdir(exist_ok=True)
    paths = []
    for i, rows in enumerate(files):
        index = first_index + i
        tmp = staging / f"in-{index:04d}.json"
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        os.utime(tmp, (BASE_MTIME + index, BASE_MTIME + index))
        final = folder / tmp.name
        os.rename(tmp, final)
        paths.append(final)
    return paths


def write_parquet_files(folder: str | os.PathLike, tables: Sequence[pa.Table],
                        first_index: int = 0) -> list[Path]:
    """Like :func:`write_json_files` for Arrow tables (Parquet keeps every type)."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / (folder.name + ".staging")
    staging.mkdir(exist_ok=True)
    paths = []
    for i, table in enumerate(tables):
        index = first_index + i
        tmp = staging / f"in-{index:04d}.parquet"
        pq.write_table(table, tmp)
        os.utime(tmp, (BASE_MTIME + index, BASE_MTIME + index))
        final = folder / tmp.name
        os.rename(tmp, final)
        paths.append(final)
    return paths


# ------------------------------------------------------------------------------- streams
@contextlib.contextmanager
def running(query):
    """Stop ``query`` on the way out, whatever happens."""
    try:
        yield query
    finally:
        try:
            if query.isActive:
                query.stop()
        except Exception:  # noqa: BLE001 - stopping is best effort in cleanup
            pass


def committed_batches(checkpoint: str | os.PathLike) -> list[int]:
    """Batch ids N with ``<checkpoint>/commits/N`` present, ascending."""
    return ckpt.committed_batches(str(checkpoint))


def stream_wal(checkpoint: str | os.PathLike, table: str | None = None) -> WalDir:
    """A stream's WAL: the one its checkpoint's pointer names (a data source's, or the WAL of
    a foreachBatch writer of ``table``, ``<keyspace>.<table>``), else where a data source's
    goes by default (``<checkpointLocation>/cassandra_wal``: not written yet)."""
    from wal.pointer import pointed_wals, read_pointers, table_slug

    if table is not None:
        name = f"cassandra_wal_sinks/{table_slug(*table.split('.', 1))}.json"
        return WalDir(read_pointers(str(checkpoint))[name])
    wals = pointed_wals(str(checkpoint))
    assert len(wals) <= 1, f"{checkpoint} names several WALs ({wals}): say which table"
    return WalDir(wals[0] if wals else os.path.join(str(checkpoint), "cassandra_wal"))


def flushed_through(wal: WalDir) -> int:
    """Highest batch id the WAL log marks flushed (-1 if none), read beside a live writer."""
    reader = WalLog.open_reader(wal)
    if reader is None:
        return -1
    try:
        return reader.flushed_through()
    finally:
        reader.close()


def wait_all_flushed(checkpoint: str | os.PathLike, wal: WalDir | None = None,
                     at_least: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> int:
    """Wait until every batch Spark committed (and at least ``at_least``) is flushed.
    Returns the last committed batch id."""
    wal = wal or stream_wal(checkpoint)

    def done():
        committed = committed_batches(checkpoint)
        if not committed or (at_least is not None and committed[-1] < at_least):
            return None
        return (committed[-1],) if flushed_through(wal) >= committed[-1] else None

    return wait_for(done, timeout, 0.3,
                    f"every committed batch of {checkpoint} to be flushed")[0]


def wait_query_done(spark, query, timeout: float = DEFAULT_TIMEOUT) -> None:
    """``awaitTermination`` with a bound, then fail if the query failed. (``spark`` is unused,
    kept for callers.)"""
    finished = query.awaitTermination(timeout)
    assert finished, f"query did not finish within {timeout:.0f}s"
    exc = query.exception()
    assert exc is None, f"query failed: {exc}"


def wait_log_released(wal: WalDir, timeout: float = 60.0) -> WalLog:
    """Open the WAL log for writing once the driver's flusher (a finished query) let it go."""
    from recovery.recover import open_writer_waiting

    return open_writer_waiting(wal, timeout)


# ------------------------------------------------------------------------------- WAL
def cassandra_wal(*args: str, env: dict | None = None,
                  timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``cassandra-wal ARGS...`` from the repository root; output captured as text."""
    return subprocess.run([*CASSANDRA_WAL, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=env)


def wal_files(wal: WalDir) -> tuple[list[str], list[str]]:
    """(segment files, seal files) present under a WAL directory (missing folders: empty)."""
    segments = []
    for batch in wal.staged_batch_ids():
        folder = wal.batch_segments(batch)
        segments += [f"{batch}/{n}" for n in sorted(os.listdir(folder))]
    seals = sorted(os.listdir(wal.seals)) if os.path.isdir(wal.seals) else []
    return segments, seals


def log_rows_by_batch(wal: WalDir, columns: Sequence[str]) -> dict[int, list[tuple]]:
    """Rows the log holds per batch (any state with rows kept), as tuples of ``columns``."""
    reader = WalLog.open_reader(wal)
    assert reader is not None, f"{wal.root} has no log"
    try:
        out: dict[int, list[tuple]] = {}
        for record in reader.records():
            rows = []
            for chunk in reader.chunks(record.batch):
                rb = decode_chunk(chunk.payload)
                rows += list(zip(*(rb.column(c).to_pylist() for c in columns)))
            out[record.batch] = rows
        return out
    finally:
        reader.close()


def segment_rows_by_batch(wal: WalDir, seals: dict, columns: Sequence[str]
                          ) -> dict[int, list[tuple]]:
    """Rows of each sealed batch in flush order (its segments in seal order), as tuples of
    ``columns``: read from the segments, while they are there (before the batch is flushed;
    the scale-out writers copy no row into the log)."""
    from wal.segment import SegmentReader

    out: dict[int, list[tuple]] = {}
    for batch, seal in seals.items():
        rows = []
        for ref in seal.segments:
            reader = SegmentReader(wal.segment_path(ref.name), batch, ref.partition, ref.name)
            for chunk in reader.chunks():
                rb = chunk.record_batch()
                rows += list(zip(*(rb.column(c).to_pylist() for c in columns)))
        out[batch] = rows
    return out


def batch_of_write_times(wal: WalDir, write_times: dict) -> dict:
    """Key -> the batch whose sealed timestamps hold its write time (``write_times``: key ->
    microseconds), from the seals the log keeps (its records are retained with their seals
    even where its rows are not); None where no seal holds it."""
    reader = WalLog.open_reader(wal)
    assert reader is not None, f"{wal.root} has no log"
    try:
        ranges = [(r.seal.base_ts_us, r.seal.base_ts_us + r.seal.rows, r.batch)
                  for r in reader.records() if r.seal is not None]
    finally:
        reader.close()
    return {k: next((b for lo, hi, b in ranges if lo <= ts < hi), None)
            for k, ts in write_times.items()}


def error_text(exc: BaseException) -> str:
    """Everything an exception says, causes included (Spark wraps Python errors)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        desc = getattr(exc, "desc", None)
        if desc:
            parts.append(str(desc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def sink_error_line(exc_or_text) -> str:
    """The ``recovery.cql.errors.<Type>: <message>`` line of a (wrapped) sink error: the message a
    user reads, without the traceback's source lines (which would match any needle)."""
    import re

    text = exc_or_text if isinstance(exc_or_text, str) else error_text(exc_or_text)
    lines = re.findall(r"^(recovery\.cql\.errors\.\w+: .*)$", text, re.MULTILINE)
    assert lines, f"no recovery.cql.errors line in the error:\n{text}"
    return lines[0]


def scrape(port: int, query_id: str) -> dict[str, float]:
    """``GET /metrics`` of the driver's endpoint (``wal.metrics.port``): the query's samples,
    by metric name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.labels.get("query_id") == query_id}
