"""Where a crash test's checkpoint, and so its WAL (``<checkpoint>/cassandra_wal``), lives:
the local disk, HDFS (``scripts/hdfs``) or S3 (moto, ``scripts/s3``).

The driver program reaches a store only as a Spark application does, from its session's
settings (``--conf spark.hadoop.dfs.namenode.http-address=...``, ``spark.hadoop.fs.s3a.*``):
the harness removes the environment's fallbacks (``CASSANDRA_WAL_WEBHDFS``, ``AWS_*``) from
its environment. The harness (this pytest process) reads the checkpoint and the WAL through
the same stores (``wal.checkpoint.open_checkpoint``, ``recovery.cli.location.read_only_wal``) with
:attr:`Storage.access`, installed for the test's duration by the ``crash_harness`` fixture.

A store's server is started once per session by the ``crash_hdfs`` / ``crash_s3`` fixtures
of ``tests/crash/conftest.py``, and only when a case on that store runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from wal.stores import ENV_WEBHDFS, StoreAccess

LOCAL, HDFS, S3 = "local", "hdfs", "s3"
#: Variables through which a process could reach a store without its Spark conf.
STORE_ENV = (ENV_WEBHDFS, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
             "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION",
             "AWS_PROFILE")


@dataclass(frozen=True)
class Storage:
    """One place for checkpoints: ``root`` is a store's URI under which each test gets a
    folder of its own (None: the test's local work dir)."""

    name: str = LOCAL
    root: str | None = None
    spark_conf: dict = field(default_factory=dict)    # the driver program's --conf
    access: StoreAccess | None = None                 # how the harness reaches the store

    @property
    def remote(self) -> bool:
        return self.root is not None

    def checkpoint_for(self, workdir: Path) -> str:
        if self.root is None:
            return str(Path(workdir) / "checkpoint")
        return f"{self.root.rstrip('/')}/crash-{uuid.uuid4().hex[:12]}/checkpoint"


LOCAL_STORAGE = Storage()


def hdfs_storage(uri: str, http: str) -> Storage:
    """HDFS at ``uri`` (``hdfs://127.0.0.1:<rpc>``) whose namenode answers HTTP at ``http``
    (``127.0.0.1:<port>``), as a cluster's ``hdfs-site.xml`` would say it."""
    authority = uri.split("://", 1)[1].split("/", 1)[0]
    return Storage(HDFS, uri, {"spark.hadoop.dfs.namenode.http-address": http},
                   StoreAccess(webhdfs=((authority, f"http://{http}"),)))


def s3_storage(bucket: str, conf: dict) -> Storage:
    """S3 (``s3a://<bucket>``) as ``conf`` (``s3_server.spark_conf``: the s3a jars and the
    ``spark.hadoop.fs.s3a.*`` settings) says; the harness reaches it with the same keys."""
    hadoop = {k[len("spark.hadoop."):]: v for k, v in conf.items()
              if k.startswith("spark.hadoop.")}
    return Storage(S3, f"s3a://{bucket}", dict(conf), StoreAccess.of_hadoop_conf(hadoop.get))
