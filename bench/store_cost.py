"""What a WAL on a store costs: requests to the store per batch and when idle, and how fast
tasks stage segments, for a WAL in a local folder, on HDFS and on S3, side by side in one run.

The servers are real and started here: HDFS is ``scripts/hdfs`` (a MiniDFSCluster, reached
through WebHDFS as the sink does), S3 is ``scripts/s3`` (moto). Both are stopped and purged at
the end, whatever happens. No Spark and no Cassandra: the sink's own code is driven the way
``tests/unit/test_remote_wal.py`` drives it.

**Requests.** One stream's WAL under its checkpoint (``<cp>/cassandra_wal``, the default), the
checkpoint on the same store. Every :class:`~wal.store.Store` the process opens goes through
:class:`CountingStore` (installed where :class:`wal.remote.RemoteWal` and the checkpoint reader
open their stores), which counts calls by method and by *phase* of a batch's life:

* ``stage``: P tasks, each a :class:`~wal.segment.SegmentWriter` in its spool, published;
* ``commit``: what :func:`sinks.worker.plan.commit_batch` does, step by step with the WAL-level
  functions it calls (a ``WritePlan`` needs a Cassandra table): the blocked check, the
  segments' visibility check, the backlog check of ``wait_for_room`` (under the cap), the seal;
* ``drain``: the flusher's drain that writes the batch: :class:`~recovery.replay.Replayer`
  ``.run`` with an upserter that keeps nothing, as the flusher runs it (retention 10 batches);
* ``retention``: the part of that drain inside ``apply_retention``;
* ``idle``: the drain after it, with nothing to do (the flusher drains every 2 s).

Spark's own writes to the checkpoint (``metadata``, ``commits/N``) are made by the bench
beside the sink's and are not counted as the sink's. The calls are also counted on the wire:
HTTP requests (WebHDFS: every request, redirects to the datanode included; S3: botocore's
``before-send`` event), and by the servers themselves: moto's request recorder
(``/moto-api/recorder/``) per phase, and the namenode's ``NameNodeActivity`` counters (``/jmx``;
cached 10 s by Hadoop, so read once before and once after the whole HDFS run).

**Staging speed.** ``--stage-mb`` of segments of ``--segment-mb`` each, written one after the
other by :class:`~wal.segment.SegmentWriter` (append, fsync, and for a store: publish, spool
removed), to the local folder, HDFS and S3 in turn; ``--rounds`` rounds, the order rotating each
round; MB/s of segment bytes, median, and its ratio to local.

    .venv/bin/python bench/store_cost.py [--partitions 4] [--batches 14] [--rows 1000]
        [--stage-mb 64] [--segment-mb 8] [--rounds 3] [--dir DIR] [--out PATH]

Prints markdown tables and writes ``bench/results/store_cost.json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import recovery.replay as replay_module
import wal.checkpoint as checkpoint_module
import wal.remote as remote_module
from recovery.replay import Replayer
from sinks.worker.plan import backlog_bytes, check_not_blocked, check_segments_visible
from wal.binding import bind
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.pointer import write_pointer
from wal.remote import spool_dir
from wal.retention import RetentionPolicy
from wal.seal import seal_batch
from wal.segment import SegmentWriter
from wal.store import LocalStore
from wal.stores import StoreAccess, open_store, use_access

OUT = REPO / "bench" / "results" / "store_cost.json"
MB = 1_000_000
BUCKET = "wal-bench"
KEYS = "testing"                       # moto accepts any; scripts/s3's fixed test keys
STORES = ("local", "hdfs", "s3")
KIND = {"create": "PUT", "read": "GET", "list": "LIST", "delete": "DELETE"}
PHASES = ("stage", "commit", "drain", "retention", "idle")
DRAIN_EVERY_S = 2.0                    # recovery.flusher.QueryFlusher's retry_interval_s
JMX_TTL_S = 11                         # Hadoop caches a source's JMX attributes for 10 s
JMX_OPS = ("CreateFileOps", "FilesRenamed", "GetListingOps", "DeleteFileOps",
           "GetBlockLocations", "FileInfoOps")


# -- counting --------------------------------------------------------------------------------
class Counts:
    """Calls by phase: ``store`` (Store methods, labelled ``wal`` or ``checkpoint``), ``wire``
    (HTTP requests the client sent) and ``server`` (what moto recorded)."""

    def __init__(self):
        self.phase = "setup"
        self.store: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.wire: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.server: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.wire_s: collections.Counter = collections.Counter()   # WebHDFS seconds by request
        self.wire_n: collections.Counter = collections.Counter()   # and their number

    def take(self) -> dict:
        """The counts so far, by phase; then zero."""
        out = {p: {"store": dict(self.store[p]), "wire": dict(self.wire[p]),
                   "server": dict(self.server[p])}
               for p in set(self.store) | set(self.wire) | set(self.server)}
        self.store.clear(), self.wire.clear(), self.server.clear()
        return out


COUNTS = Counts()


class CountingStore:
    """A :class:`~wal.store.Store` that counts its calls in :data:`COUNTS` and passes them on."""

    def __init__(self, store, label: str):
        self.store, self.label, self.uri = store, label, store.uri

    def _count(self, method: str) -> None:
        COUNTS.store[COUNTS.phase][f"{self.label} {KIND[method]}"] += 1

    def create(self, key: str, data: bytes) -> bool:
        self._count("create")
        return self.store.create(key, data)

    def read(self, key: str) -> bytes | None:
        self._count("read")
        return self.store.read(key)

    def list(self, prefix: str = "") -> list[str]:
        self._count("list")
        return self.store.list(prefix)

    def delete(self, key: str) -> None:
        self._count("delete")
        self.store.delete(key)

    def delete_many(self, keys: list[str]) -> None:
        if keys:        # S3: one DeleteObjects per 1,000 keys; elsewhere one DELETE a key
            s3 = getattr(self.store, "client", None) is not None
            for _ in range(-(-len(keys) // 1000) if s3 else len(keys)):
                self._count("delete")
        self.store.delete_many(keys)

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        if getattr(self.store, "client", None) is None:    # S3 has no folders: no request
            self._count("delete")
        elif recursive:                                     # S3: a listing, then the keys
            self._count("list")
            keys = self.store.list(prefix)
            if keys:
                self.delete_many(keys)
            return
        self.store.delete_folder(prefix, recursive)


_hooked_clients: set[int] = set()


def counted_open_store(label: str):
    def opener(uri: str, **kwargs):
        store = open_store(uri, **kwargs)
        client = getattr(store, "client", None)       # S3: count botocore's sends too
        if client is not None and id(client) not in _hooked_clients:
            _hooked_clients.add(id(client))
            client.meta.events.register("before-send.s3", _count_s3_send)
        return CountingStore(store, label)
    return opener


def _count_s3_send(event_name: str, **_) -> None:
    COUNTS.wire[COUNTS.phase][event_name.rsplit(".", 1)[-1]] += 1


_urllib_open = urllib.request.OpenerDirector.open


def _counted_urllib_open(self, fullurl, data=None, *args, **kwargs):
    """Every WebHDFS request, the datanode's included (a redirect is opened through here)."""
    request = fullurl if isinstance(fullurl, urllib.request.Request) else None
    url = request.full_url if request else fullurl
    parts = urllib.parse.urlsplit(url)
    if "/webhdfs/v1" in parts.path:
        op = urllib.parse.parse_qs(parts.query).get("op", ["?"])[0]
        method = request.get_method() if request else ("POST" if data else "GET")
        where = "namenode" if parts.port == HDFS_HTTP_PORT[0] else "datanode"
        key = f"{method} {op} ({where})"
        started = time.perf_counter()
        try:
            response = _urllib_open(self, fullurl, data, *args, **kwargs)
        except urllib.error.HTTPError as exc:
            if exc.code != 307:       # a CREATE's redirect is its normal answer
                key += f" {exc.code}"
            raise
        finally:
            COUNTS.wire[COUNTS.phase][key] += 1
            COUNTS.wire_s[key] += time.perf_counter() - started
            COUNTS.wire_n[key] += 1
        return response
    return _urllib_open(self, fullurl, data, *args, **kwargs)


HDFS_HTTP_PORT = [0]


def install_counting() -> None:
    """Where the WAL (``RemoteWal.at``) and the checkpoint reader open their stores."""
    remote_module.open_store = counted_open_store("wal")
    checkpoint_module.open_store = counted_open_store("checkpoint")
    urllib.request.OpenerDirector.open = _counted_urllib_open
    real = replay_module.apply_retention

    def retention(*args, **kwargs):
        before, COUNTS.phase = COUNTS.phase, "retention"
        try:
            return real(*args, **kwargs)
        finally:
            COUNTS.phase = before
    replay_module.apply_retention = retention
    remote_module.RemoteWal.publish_segment = _timed_publish


# -- servers ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(*args, timeout: float = 300) -> str:
    done = subprocess.run([str(REPO / "scripts" / args[0]), *map(str, args[1:])], check=False,
                          text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"scripts/{shlex.join(map(str, args))}: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


@contextlib.contextmanager
def servers(scratch: Path):
    """HDFS and S3, started for this run and stopped (purged) whatever happens."""
    hdfs_dir, s3_dir = scratch / "hdfs-server", scratch / "s3-server"
    hdfs_port, http_port, s3_port = free_port(), free_port(), free_port()
    HDFS_HTTP_PORT[0] = http_port
    try:
        started = time.monotonic()
        script("hdfs", "start", "--dir", hdfs_dir, "--port", hdfs_port, "--http-port", http_port)
        hdfs_s = time.monotonic() - started
        started = time.monotonic()
        endpoint = script("s3", "start", "--dir", s3_dir, "--port", s3_port, "--bucket", BUCKET,
                          timeout=120)
        s3_s = time.monotonic() - started
        use_access(StoreAccess(
            webhdfs=((f"127.0.0.1:{hdfs_port}", f"http://127.0.0.1:{http_port}"),),
            s3_endpoint=endpoint, s3_region="us-east-1", s3_path_style=True,
            s3_access_key=KEYS, s3_secret_key=KEYS))
        yield {"hdfs": f"hdfs://127.0.0.1:{hdfs_port}", "webhdfs": f"http://127.0.0.1:{http_port}",
               "s3": endpoint, "start_s": {"hdfs": round(hdfs_s, 1), "s3": round(s3_s, 1)}}
    finally:
        for name, folder in (("hdfs", hdfs_dir), ("s3", s3_dir)):
            if folder.exists():
                subprocess.run([str(REPO / "scripts" / name), "stop", "--dir", str(folder),
                                "--purge"], check=False, capture_output=True, timeout=120,
                               stdin=subprocess.DEVNULL)


class MotoRecorder:
    """moto's own record of the requests it served (``/moto-api/recorder/``), by phase."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def _call(self, what: str, method: str = "POST") -> str:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{what}",
                                         method=method, data=b"" if method == "POST" else None)
        with _urllib_open(urllib.request.build_opener(), request) as response:
            return response.read().decode()

    def start(self) -> None:
        self._call("reset-recording")
        self._call("start-recording")

    def stop(self) -> None:
        self._call("stop-recording")
        self._call("reset-recording")

    def take(self) -> collections.Counter:
        """The requests recorded since the last take, by kind; then forgets them."""
        out = collections.Counter()
        for line in self._call("download-recording", "GET").splitlines():
            entry = json.loads(line)
            query = urllib.parse.urlsplit(entry["url"]).query
            kind = "LIST" if entry["method"] == "GET" and "list-type" in query else entry["method"]
            out[kind] += 1
        self._call("reset-recording")
        return out


def namenode_ops(webhdfs: str) -> dict:
    with _urllib_open(urllib.request.build_opener(), f"{webhdfs}/jmx?qry=Hadoop:service="
                      "NameNode,name=NameNodeActivity") as response:
        bean = json.loads(response.read())["beans"][0]
    return {k: bean[k] for k in JMX_OPS}


# -- one stream's batches --------------------------------------------------------------------
class NullUpserter:
    """Takes every chunk and writes it nowhere (the flusher's rows are not what is measured)."""

    def write_chunks(self, chunks, batch_id: int, age=None):
        for _rb, _first_ts, tag in chunks:
            yield tag


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "name": pa.array([f"row-{i}" for i in ids], pa.string())})


class Stream:
    """One query's WAL (``<cp>/cassandra_wal``) with its checkpoint, its commit and its flusher
    on one driver host, and its tasks."""

    def __init__(self, cp: str, spark_store, partitions: int, rows_per_task: int):
        self.cp, self.spark = cp, spark_store
        self.wal_uri = cp.rstrip("/") + "/cassandra_wal"
        self.partitions, self.rows = partitions, rows_per_task
        self.query_id = str(uuid.uuid4())

    def start(self) -> None:
        """Query start: Spark's ``metadata``; the sink opens the WAL, binds it, records its
        target and pointer (``prepare_write``); the flusher opens its log and recovers."""
        self.spark.create("metadata", json.dumps({"id": self.query_id}).encode() + b"\n")
        self.wal = WalDir.at(self.wal_uri).create()
        bind(self.wal, self.cp)
        self.wal.write_target({"keyspace": "bench", "table": "t", "columns": ["id", "name"]})
        write_pointer(self.cp, self.wal.location)
        self.flusher_wal = WalDir.at(self.wal_uri)        # QueryFlusher's: the same working copy
        self.wal_log = WalLog.open_writer(self.flusher_wal)
        self.replayer = Replayer(self.flusher_wal, self.wal_log, lambda seal: NullUpserter(),
                                 self.cp, retention=RetentionPolicy(keep_batches=10))
        self.replayer.run(RecoveryPolicy.QUERY_START)

    def stage(self, batch: int) -> list:
        refs = []
        for partition in range(self.partitions):
            task_wal = (WalDir(spool_dir(self.wal_uri), spool_for=self.wal_uri)
                        if self.wal.remote else self.wal)
            writer = SegmentWriter(task_wal, batch, partition, 0, {"columns": ["id", "name"]})
            writer.append(rows(self.rows, (batch * self.partitions + partition) * self.rows))
            refs.append(writer.finish())
        return refs

    def commit(self, batch: int, refs: list) -> None:
        """``commit_batch``'s steps (sinks/worker/plan.py), with the backlog under the cap."""
        check_not_blocked(self.wal)
        check_segments_visible(self.wal, refs, batch)
        backlog_bytes(self.wal, batch)
        seal_batch(self.wal, batch, refs, query_id=self.query_id)

    def spark_commit(self, batch: int) -> None:
        self.spark.create(f"commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}\n')

    def drain(self) -> object:
        return self.replayer.run(RecoveryPolicy.QUERY_FLUSHER)

    def close(self) -> None:
        self.wal_log.close()


def count_requests(store: str, cp: str, spark_store, args, recorder: MotoRecorder | None
                   ) -> dict:
    """Every phase of ``args.batches`` batches of one stream: counts and seconds."""
    stream = Stream(cp, spark_store, args.partitions, args.rows)
    COUNTS.take()
    COUNTS.phase = "start"
    if recorder:
        recorder.start()
    started = time.perf_counter()
    stream.start()
    start = {"seconds": time.perf_counter() - started, **COUNTS.take().get("start", {})}
    if recorder:
        start["server"] = dict(recorder.take())
    batches = []
    try:
        for batch in range(args.batches):
            seconds, counts = {}, {}
            refs: list = []
            for phase in ("stage", "commit", "spark", "drain", "idle"):
                COUNTS.phase = phase
                started = time.perf_counter()
                if phase == "stage":
                    refs = stream.stage(batch)
                elif phase == "commit":
                    stream.commit(batch, refs)
                elif phase == "spark":
                    stream.spark_commit(batch)
                else:
                    result = stream.drain()
                    if phase == "drain" and result.replayed != [batch]:
                        raise SystemExit(f"{store}: batch {batch} not flushed: {result}")
                seconds[phase] = time.perf_counter() - started
                taken = COUNTS.take()
                if recorder:
                    # The retention's requests are inside the drain's window on the server.
                    taken.setdefault(phase, {})["server"] = dict(recorder.take())
                counts.update(taken)
            batches.append({"batch": batch, "seconds": seconds, "counts": counts})
    finally:
        stream.close()
        if recorder:
            recorder.stop()
    return {"start": start, "batches": batches}


def http_seconds() -> dict:
    """WebHDFS requests since the last call: how many of each and their mean seconds."""
    out = {key: {"requests": n, "mean_s": round(COUNTS.wire_s[key] / n, 4)}
           for key, n in COUNTS.wire_n.items()}
    COUNTS.wire_s.clear(), COUNTS.wire_n.clear()
    return out


def expected_namenode_ops(result: dict) -> dict:
    """The namenode's counters as the client's WebHDFS requests predict them: an OPEN that
    finds its file looks its blocks up twice (the redirect, then the datanode's own client);
    a LISTSTATUS or OPEN of nothing (404) is a file-info lookup, not a listing; a DELETE of
    nothing answers ``false`` and is not counted as a delete."""
    sent = collections.Counter(result["start"].get("wire", {}))
    for batch in result["batches"]:
        for got in batch["counts"].values():
            sent += collections.Counter(got.get("wire", {}))
    return {"CreateFileOps": sent["PUT CREATE (namenode)"],
            "FilesRenamed": sent["PUT RENAME (namenode)"],
            "GetListingOps": sent["GET LISTSTATUS (namenode)"],
            "DeleteFileOps (at most)": sent["DELETE DELETE (namenode)"],
            "GetBlockLocations": 2 * sent["GET OPEN (namenode)"],
            "FileInfoOps": sent["GET OPEN (namenode)"] + sent["GET OPEN (namenode) 404"]}


# -- staging speed ---------------------------------------------------------------------------
def segment_chunks(segment_mb: float) -> list[pa.RecordBatch]:
    """10,000-row chunks (Spark's Arrow batch) of about ``segment_mb`` MB of Arrow data."""
    chunk = pa.record_batch({"id": pa.array(range(10_000), pa.int64()),
                             "payload": pa.array([f"{i:08d}" + "x" * 92 for i in range(10_000)],
                                                 pa.string())})
    return [chunk] * max(1, round(segment_mb * MB / chunk.nbytes))


PUBLISH_S = [0.0]
_publish_segment = remote_module.RemoteWal.publish_segment


def _timed_publish(self, name: str, path: str) -> None:
    started = time.perf_counter()
    try:
        _publish_segment(self, name, path)
    finally:
        PUBLISH_S[0] += time.perf_counter() - started


def stage_once(kind: str, location: str, chunks, segments: int, batch: int) -> dict:
    """``segments`` segments written one after the other, as tasks do; then removed. Also the
    seconds spent publishing them (reading the spooled file and sending it)."""
    PUBLISH_S[0] = 0.0
    wal = (WalDir(spool_dir(location), spool_for=location) if kind != "local"
           else WalDir(location).create())
    written = 0
    started = time.perf_counter()
    for partition in range(segments):
        writer = SegmentWriter(wal, batch, partition, 0, {"columns": ["id", "payload"]})
        for chunk in chunks:
            writer.append(chunk)
        written += writer.finish().bytes
    seconds = time.perf_counter() - started
    if kind == "local":
        shutil.rmtree(wal.batch_segments(batch))
    else:
        store = open_store(location)
        for key in store.list("segments"):
            store.delete(key)
    return {"seconds": seconds, "publish_seconds": PUBLISH_S[0], "bytes": written,
            "mb_per_s": written / MB / seconds}


# -- report ----------------------------------------------------------------------------------
def by_kind(counter: dict, label: str | None = None) -> collections.Counter:
    out = collections.Counter()
    for key, n in counter.items():
        who, _, kind = key.partition(" ")
        if label is None or who == label:
            out[kind] += n
    return out


def fmt_kinds(counter: collections.Counter) -> str:
    total = sum(counter.values())
    parts = [f"{counter[k]} {k}" for k in ("PUT", "GET", "LIST", "DELETE") if counter[k]]
    return f"{total} ({', '.join(parts)})" if parts else "0"


def phase_counts(batch: dict, phases) -> dict:
    """Store calls by kind, HTTP requests sent (HDFS: every WebHDFS request; S3: botocore's
    sends) and requests the server recorded (moto), summed over ``phases`` of one batch."""
    calls, wire, server = collections.Counter(), collections.Counter(), collections.Counter()
    for phase in phases:
        got = batch["counts"].get(phase, {})
        calls += by_kind(got.get("store", {}))
        wire += collections.Counter(got.get("wire", {}))
        server += collections.Counter(got.get("server", {}))
    return {"calls": dict(calls), "calls_total": sum(calls.values()),
            "http": sum(wire.values()), "server": sum(server.values()) if server else None,
            "http_by_op": dict(wire)}


ROWS = (("stage (P tasks)", ("stage",)), ("commit", ("commit",)),
        ("drain that flushes it (retention included)", ("drain", "retention")),
        ("of which retention", ("retention",)),
        ("batch total", ("stage", "commit", "drain", "retention")),
        ("idle drain after it", ("idle",)))


def machine() -> dict:
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), "")
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
    from importlib.metadata import version
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_gib": round(mem_kb / 2**20, 1),
            "platform": platform.platform(), "loadavg_1_5_15_at_start": list(os.getloadavg()),
            "versions": {"python": platform.python_version(),
                         **{d: version(d) for d in ("pyarrow", "boto3", "moto",
                                                    "cassandra-wal-sink")},
                         "hadoop (MiniDFSCluster)": "3.5.0"}}


def git_head() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=False,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           check=False,
                           capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes in the tree)" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4, help="tasks a batch (4)")
    parser.add_argument("--batches", type=int, default=14,
                        help="batches of the stream; retention keeps 10 (14)")
    parser.add_argument("--rows", type=int, default=1000, help="rows a task (1000)")
    parser.add_argument("--stage-mb", type=float, default=64, help="MB staged a round (64)")
    parser.add_argument("--segment-mb", type=float, default=8, help="MB a segment (8)")
    parser.add_argument("--rounds", type=int, default=3, help="staging rounds (3)")
    parser.add_argument("--dir", help="scratch folder (default: a temp folder, removed)")
    parser.add_argument("--out", default=str(OUT), help=f"JSON results (default {OUT})")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    facts = machine()
    scratch = Path(tempfile.mkdtemp(prefix="store-cost-", dir=args.dir))
    os.chmod(scratch, 0o700)
    os.environ["CASSANDRA_WAL_WORKING_DIR"] = str(scratch / "working")
    tempfile.tempdir = str(scratch / "tmp")            # where tasks spool
    os.makedirs(tempfile.tempdir, mode=0o700)
    install_counting()
    run = uuid.uuid4().hex[:8]
    doc = {"command": shlex.join([".venv/bin/python", "bench/store_cost.py",
                                  *(argv if argv is not None else sys.argv[1:])]),
           "date_utc": started.strftime("%Y-%m-%d %H:%M"), "commit": git_head(),
           "machine": facts, "params": vars(args)}
    try:
        with servers(scratch) as srv:
            doc["servers"] = srv
            cps = {"local": str(scratch / "local" / "cp"),
                   "hdfs": f"{srv['hdfs']}/bench-{run}/cp",
                   "s3": f"s3a://{BUCKET}/bench-{run}/cp"}
            os.makedirs(cps["local"], mode=0o700)
            spark = {"local": LocalStore(cps["local"]), "hdfs": open_store(cps["hdfs"]),
                     "s3": open_store(cps["s3"])}
            # -- requests
            doc["requests"] = {}
            time.sleep(JMX_TTL_S)             # a read by the start script is cached no more
            jmx_before = namenode_ops(srv["webhdfs"])
            for store in STORES:
                recorder = MotoRecorder(srv["s3"]) if store == "s3" else None
                doc["requests"][store] = count_requests(store, cps[store], spark[store], args,
                                                        recorder)
            time.sleep(JMX_TTL_S)
            jmx_after = namenode_ops(srv["webhdfs"])
            doc["hdfs_namenode_ops"] = {k: jmx_after[k] - jmx_before[k] for k in JMX_OPS}
            doc["hdfs_namenode_ops_expected_from_the_client"] = expected_namenode_ops(
                doc["requests"]["hdfs"])
            doc["hdfs_http_by_request_in_the_request_run"] = http_seconds()
            # -- staging speed
            chunks = segment_chunks(args.segment_mb)
            segments = max(1, round(args.stage_mb / args.segment_mb))
            where = {"local": str(scratch / "stage-local"),
                     "hdfs": f"{srv['hdfs']}/stage-{run}", "s3": f"s3a://{BUCKET}/stage-{run}"}
            os.makedirs(where["local"], mode=0o700)
            COUNTS.phase = "staging"
            rounds = []
            for r in range(args.rounds):
                order = STORES[r % 3:] + STORES[:r % 3]
                rounds.append({s: stage_once(s, where[s], chunks, segments, r) for s in order})
                rounds[-1]["order"] = list(order)
            doc["staging"] = {"segments": segments, "rounds": rounds,
                              "hdfs_http_by_request": http_seconds()}
            COUNTS.take()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(doc)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


def report(doc: dict) -> None:
    p = doc["params"]
    summary = {}
    for store, res in doc["requests"].items():
        summary[store] = {
            f"batch_{b['batch']}": {name: phase_counts(b, phases) for name, phases in ROWS}
            | {"seconds": b["seconds"]}
            for b in (res["batches"][0], res["batches"][-1])}
        summary[store]["idle_calls_by_batch"] = [
            phase_counts(b, ("idle",))["calls_total"] for b in res["batches"]]
        summary[store]["idle_http_by_batch"] = [
            phase_counts(b, ("idle",))["http"] for b in res["batches"]]
        summary[store]["query_start"] = {
            "calls": dict(by_kind(res["start"].get("store", {}))),
            "http": sum(res["start"].get("wire", {}).values()),
            "server": sum(res["start"].get("server", {}).values()) or None}
    doc["summary"] = summary
    last = f"batch_{p['batches'] - 1}"
    print(f"\n### Requests of one batch ({p['partitions']} partitions, {p['rows']} rows a task): "
          f"batch {p['batches'] - 1} of a stream, retention keeping 10\n")
    print("| phase | store calls, HDFS | store calls, S3 | HDFS HTTP requests | S3 requests "
          "(client / moto) |\n|---|---|---|---:|---:|")
    for name, _ in ROWS:
        h, s3 = summary["hdfs"][last][name], summary["s3"][last][name]
        print(f"| {name} | {fmt_kinds(collections.Counter(h['calls']))} | "
              f"{fmt_kinds(collections.Counter(s3['calls']))} | {h['http']} | "
              f"{s3['http']} / {s3['server']} |")
    print("\n| idle drain | local | HDFS calls / HTTP | S3 calls / requests |\n|---|---:|---:|---:|")
    for label, i in (("after batch 0", 0), (f"after batch {p['batches'] - 1}", -1)):
        print(f"| {label} | {summary['local']['idle_calls_by_batch'][i]} | "
              f"{summary['hdfs']['idle_calls_by_batch'][i]} / "
              f"{summary['hdfs']['idle_http_by_batch'][i]} | "
              f"{summary['s3']['idle_calls_by_batch'][i]} / "
              f"{summary['s3']['idle_http_by_batch'][i]} |")
    per_min = 60 / DRAIN_EVERY_S
    print(f"| a minute idle (a drain every {DRAIN_EVERY_S:g} s), after batch {p['batches'] - 1} | 0 | "
          f"{summary['hdfs']['idle_calls_by_batch'][-1] * per_min:.0f} / "
          f"{summary['hdfs']['idle_http_by_batch'][-1] * per_min:.0f} | "
          f"{summary['s3']['idle_calls_by_batch'][-1] * per_min:.0f} / "
          f"{summary['s3']['idle_http_by_batch'][-1] * per_min:.0f} |")
    print("\nSeconds of batch", p["batches"] - 1, "by phase (local / HDFS / S3): " + "; ".join(
        f"{ph} " + " / ".join(f"{summary[s][last]['seconds'][ph]:.3f}" for s in STORES)
        for ph in ("stage", "commit", "drain", "idle")))
    print("HDFS namenode ops over the request run, its /jmx:", doc["hdfs_namenode_ops"],
          "as the client's requests predict them:",
          doc["hdfs_namenode_ops_expected_from_the_client"])
    staging = doc["staging"]
    med = {s: statistics.median(r[s]["mb_per_s"] for r in staging["rounds"]) for s in STORES}
    pub = {s: statistics.median(r[s]["publish_seconds"] / r[s]["seconds"]
                                for r in staging["rounds"]) for s in STORES}
    staging["median_mb_per_s"] = med
    staging["ratio_to_local"] = {s: med[s] / med["local"] for s in STORES}
    staging["median_publish_share"] = pub
    print(f"\n### Staging: {staging['segments']} segments of {p['segment_mb']:g} MB a round, "
          f"{p['rounds']} rounds, alternating\n")
    print("| WAL | MB/s by round | median MB/s | vs local | share of the time publishing |\n"
          "|---|---|---:|---:|---:|")
    for s in STORES:
        by_round = ", ".join(f"{r[s]['mb_per_s']:.1f}" for r in staging["rounds"])
        print(f"| {s} | {by_round} | {med[s]:.1f} | {staging['ratio_to_local'][s]:.3f}x | "
              f"{pub[s]:.0%} |")


if __name__ == "__main__":
    sys.exit(main())
