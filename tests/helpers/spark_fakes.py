"""The driver's side of Spark without Spark, for the flush registry: a flusher that records what
the registry asks of it, a SparkSession that knows its queries' checkpoints, and the WALs a
checkpoint's pointers name."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from recovery.config import SinkConfig


class FakeFlusher:
    made: list["FakeFlusher"] = []

    def __init__(self, wal_root, checkpoint, session_conf=None, spark_jobs="unset", run=None,
                 on_options=None):
        self.wal_root, self.checkpoint, self.spark_jobs = wal_root, checkpoint, spark_jobs
        self.on_options = on_options            # what the real one calls on new options
        self.wal = SimpleNamespace(root=wal_root)
        self.calls: list[str] = []
        self.finish_within: list[float] = []    # each stop's bound for retrying its last drain
        self.stopped = threading.Event()
        self.release = threading.Event()        # a stop's last drain ends when this is set
        self.release.set()
        self.target = SimpleNamespace(config=SinkConfig("ks", "t"))   # no wal.metrics.port
        FakeFlusher.made.append(self)

    def recover(self):
        self.calls.append("recover")

    def start(self):
        self.calls.append("start")

    def kick(self):
        self.calls.append("kick")

    def stop(self, finish_within_s=0.0, exiting=False, final_drain=True):
        self.calls.append("stop")
        self.finish_within.append(finish_within_s)
        self.release.wait(10)
        self.stopped.set()

    def hand_over(self):
        self.calls.append("hand_over")
        self.release.set()

    def mark_exiting(self):
        self.calls.append("mark_exiting")


class FakeSpark:
    """Just enough of a SparkSession: ``spark.streams.get(id)`` of a query whose checkpoint is
    ``/cp/<id>`` (the registry), and whether its SparkContext is stopped (the flusher asks)."""

    class _Streams:
        def get(self, query_id):
            root = f"/cp/{query_id}"
            streaming = type("SQ", (), {"resolvedCheckpointRoot": lambda _s: root})()
            jsq = type("JSQ", (), {"streamingQuery": lambda _s: streaming})()
            return type("Q", (), {"_jsq": jsq, "name": None})()

    streams = _Streams()

    def __init__(self, stopped: bool = False, master: str = "local[2]"):
        jsc = type("Jsc", (), {"sc": lambda _self: type("Sc", (), {
            "isStopped": lambda _s: stopped})()})()
        self.sparkContext = type("Ctx", (), {"_jsc": jsc, "master": master})()


def pointing(wal_of):
    """``pointed_wals`` of checkpoints whose only WAL is ``wal_of(checkpoint)`` (None: none)."""
    def pointed_wals(checkpoint):
        wal = wal_of(checkpoint)
        return [] if wal is None else [wal]
    return pointed_wals
