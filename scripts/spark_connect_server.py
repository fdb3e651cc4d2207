"""Run a local Spark Connect server from the pyspark in the project's venv (stdlib only).

Used by the ``scripts/spark-connect`` command line and by
``tests/integration/test_spark_connect.py``. One JVM,
``org.apache.spark.sql.connect.service.SparkConnectServer`` (its jar ships inside the pip
package: ``pyspark/jars/spark-connect_2.13-<version>.jar``), started with pyspark's
``bin/spark-submit`` as ``sbin/start-connect-server.sh`` does, but in the foreground so that
the pid recorded is the JVM's. Layout of a server dir (default ``<cache>/server-<port>``,
``<cache>`` being ``$CASSANDRA_WAL_CONNECT_CACHE`` or ``<repo>/.cache/spark-connect``)::

    connect.json     port, pid, master, python, spark version of the last start
    connect.pid      pid of the running JVM (removed by stop)
    server.log       the JVM's stdout/stderr
    tmp/             spark.local.dir and java.io.tmpdir
    spark-warehouse/ spark.sql.warehouse.dir

The JVM runs with the server dir as its working directory (a relative checkpoint location
resolves there), which is how ``stop``/``status`` recognise it (with the main class on its
command line). Everything binds 127.0.0.1: the gRPC port (``--port``), the driver and its
block manager (``spark.driver.bindAddress``); the web UI is off. ``start`` checks the JVM's
listening sockets and stops it if any is bound elsewhere.

Python: the data source a client registers runs in the server's Python workers, which must
import this project: they run the venv's interpreter (``spark.pyspark.python``) with the
repository on ``PYTHONPATH``.

Readiness: the gRPC port accepts a TCP connection (the server opens it last, once its
SparkSession is up).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SCRIPTS_DIR = Path(__file__).resolve().parent
if str(SCRIPTS_DIR) not in sys.path:  # local_server.py, however this file is loaded
    sys.path.insert(0, str(SCRIPTS_DIR))

import hdfs_node  # noqa: E402  (listening_addresses, is_loopback: the JVM's sockets)
import local_server  # noqa: E402
from local_server import HOST, free_port, log, port_in_use  # noqa: E402, F401 (API)

REPO_ROOT = SCRIPTS_DIR.parent
DEFAULT_PORT = 15002          # Spark Connect's own default (sc://localhost:15002)
DEFAULT_MASTER = "local[2]"
DEFAULT_TIMEOUT = 120.0
DEFAULT_HEAP = "1g"
STOP_TIMEOUT = 20.0
MAIN_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

CACHE = local_server.Cache("CASSANDRA_WAL_CONNECT_CACHE", "spark-connect")


class SparkConnectError(local_server.ServerError):
    """A start/stop failure with a message meant for humans."""


class PortInUseError(SparkConnectError):
    pass


def url(port: int, host: str = HOST) -> str:
    """What a client passes to ``SparkSession.builder.remote``."""
    return f"sc://{host}:{port}"


# --------------------------------------------------------------------------------------------
# pyspark, Python, Java


def venv_python() -> Path:
    """The interpreter of the server's Python workers: ``$CASSANDRA_WAL_CONNECT_PYTHON``, else
    the project's ``.venv/bin/python``, else this one."""
    override = os.environ.get("CASSANDRA_WAL_CONNECT_PYTHON")
    if override:
        return Path(override)
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


def spark_home(python: Path) -> Path:
    """The pyspark package folder of ``python``'s environment (it carries ``bin/spark-submit``
    and the Connect jar)."""
    for d in sorted(python.parent.parent.glob("lib/python3*/site-packages/pyspark")):
        if (d / "bin" / "spark-submit").exists():
            return d
    raise SparkConnectError(f"no pyspark with bin/spark-submit next to {python}; run "
                            "scripts/bootstrap (or set CASSANDRA_WAL_CONNECT_PYTHON)")


def connect_jar(home: Path) -> Path:
    jars = sorted((home / "jars").glob("spark-connect_*.jar"))
    if not jars:
        raise SparkConnectError(f"{home}/jars holds no spark-connect_*.jar: this pyspark has "
                                "no Spark Connect server (4.0 or newer ships it)")
    return jars[-1]


def spark_version(home: Path) -> str:
    name = connect_jar(home).name.removesuffix(".jar")
    return name.rsplit("-", 1)[-1]


def find_java_home() -> Path:
    """A JDK for Spark 4: $CASSANDRA_WAL_CONNECT_JAVA_HOME, else a JDK 17, else 21 or newer."""
    return local_server.find_java_home(
        "CASSANDRA_WAL_CONNECT_JAVA_HOME", also=lambda major: major >= 17,
        error=SparkConnectError,
        none_found="no JDK 17 or newer found; set CASSANDRA_WAL_CONNECT_JAVA_HOME")


# --------------------------------------------------------------------------------------------
# server state


@dataclass
class ServerInfo:
    server_dir: str
    port: int
    pid: Optional[int] = None
    master: str = DEFAULT_MASTER
    python: str = ""
    spark_version: str = ""
    conf: Dict[str, str] = field(default_factory=dict)   # --conf given at start
    started_at: Optional[float] = None
    startup_seconds: Optional[float] = None
    listening: List[str] = field(default_factory=list)
    already_running: bool = False  # set by start(); not saved

    @property
    def url(self) -> str:
        return url(self.port)


def _state_json(info: ServerInfo) -> dict:
    data = {**asdict(info), "url": info.url}
    data.pop("already_running")
    return data


def tail_log(server_dir: Path, lines: int = 40) -> str:
    return local_server.tail_log(Path(server_dir) / "server.log", lines)


def _is_server_of(pid: int, server_dir: Path) -> bool:
    """Whether pid is a Spark Connect server JVM working in server_dir."""
    if MAIN_CLASS not in local_server.read_cmdline(pid):
        return False
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == Path(server_dir).resolve()
    except OSError:
        return False


KIND = local_server.ServerKind(
    noun="Spark Connect server", cache=CACHE, dir_prefix="server", default_port=DEFAULT_PORT,
    state=ServerInfo, to_json=_state_json, dir_key="server_dir", state_file="connect.json",
    pid_file="connect.pid", files=("server.log", "tmp", "spark-warehouse", "metastore_db",
                                   "derby.log"),
    matches=_is_server_of, tail=tail_log, error=SparkConnectError, port_error=PortInUseError)


def answers(port: int, timeout: float = 1.0) -> bool:
    """The gRPC port accepts a connection."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def parse_conf(items: Sequence[str]) -> Dict[str, str]:
    conf = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SparkConnectError(f"--conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


def command(info: ServerInfo, home: Path, heap: str) -> List[str]:
    server_dir = Path(info.server_dir)
    tmp = server_dir / "tmp"
    conf = {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(info.port),
        "spark.driver.bindAddress": HOST,
        "spark.driver.host": HOST,
        "spark.ui.enabled": "false",
        "spark.local.dir": str(tmp),
        "spark.sql.warehouse.dir": str(server_dir / "spark-warehouse"),
        "spark.pyspark.python": info.python,
        "spark.pyspark.driver.python": info.python,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        **info.conf,
    }
    cmd = [str(home / "bin" / "spark-submit"), "--class", MAIN_CLASS,
           "--name", "Spark Connect server", "--master", info.master, "--driver-memory", heap]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def server_env(java_home: Path, home: Path, python: str) -> dict:
    env = local_server.java_env(java_home, "SPARK_CONF_DIR", "SPARK_REMOTE", "SPARK_CONNECT_MODE",
                                "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_DRIVER_PYTHON",
                                "SPARK_LOCAL_IP", "HADOOP_CONF_DIR")
    path = [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=python, PYTHONPATH=os.pathsep.join(path),
               SPARK_LOCAL_IP=HOST)
    return env


# --------------------------------------------------------------------------------------------
# start / stop / status


def start(port: Optional[int] = None, server_dir: Optional[os.PathLike] = None, *,
          master: str = DEFAULT_MASTER, conf: Optional[Dict[str, str]] = None,
          timeout: float = DEFAULT_TIMEOUT, heap: str = DEFAULT_HEAP,
          quiet: bool = False) -> ServerInfo:
    """Start (or reuse) the Spark Connect server of server_dir and wait until its port answers.
    The JVM runs in its own session (a Ctrl-C in the terminal does not reach it);
    ``already_running`` of the result tells whether it was up before. Raises PortInUseError /
    SparkConnectError on failure, leaving no JVM behind."""
    port, server_dir = KIND.resolve(port, server_dir)
    say = (lambda m: None) if quiet else log
    created = not server_dir.exists()
    server_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _start_locked(port, server_dir, master, conf or {}, timeout, heap, say)
    except BaseException:
        if created:  # a start that failed in a new dir leaves nothing behind
            stop(port, server_dir, purge=True)
        raise


def _start_locked(port: int, server_dir: Path, master: str, conf: Dict[str, str],
                  timeout: float, heap: str, say) -> ServerInfo:
    with KIND.lock(server_dir):
        info = KIND.running(server_dir, port)
        if info:
            pid = info.pid
            KIND.refuse_other_port(info, port)
            if local_server.wait_until(lambda: answers(port) or None,
                                       KIND.still_ours(pid, server_dir), timeout,
                                       interval=0.5) is None:
                raise SparkConnectError(f"Spark Connect server in {server_dir} (pid {pid}) "
                                        "died\n" + tail_log(server_dir))
            say(f"Spark Connect server already running at {info.url} (pid {pid}, "
                f"dir {server_dir})")
            info.already_running = True
            return info
        KIND.require_free((port, "port"))
        python = venv_python()
        home = spark_home(python)
        java_home = find_java_home()
        info = ServerInfo(server_dir=str(server_dir), port=port, master=master,
                          python=str(python), spark_version=spark_version(home), conf=conf)
        (server_dir / "tmp").mkdir(exist_ok=True)
        say(f"starting Spark Connect {info.spark_version} ({master}) on {info.url} "
            f"(dir {server_dir}) ...")
        t0 = time.monotonic()
        proc = KIND.launch(info, command(info, home, heap), server_dir / "server.log",
                           server_env(java_home, home, info.python))
        KIND.wait_launched(
            proc, server_dir, lambda: answers(port) or None, timeout=timeout, interval=0.5,
            what=f"Spark Connect server in {server_dir}", kill_timeout=STOP_TIMEOUT,
            not_ready=lambda: f"did not answer on {info.url} within {timeout:.0f}s",
            exited="exited with code {} while starting")
        info.startup_seconds = round(time.monotonic() - t0, 1)
        info.listening = hdfs_node.listening_addresses(proc.pid)
        outside = [a for a in info.listening if not hdfs_node.is_loopback(a)]
        if outside:
            raise KIND.failed_start(proc, server_dir, f"Spark Connect server in {server_dir} "
                                    f"listens on non-loopback addresses {outside}; stopped it",
                                    STOP_TIMEOUT)
        KIND.save(info)
        say(f"Spark Connect server is up at {info.url} after {info.startup_seconds}s "
            f"(pid {proc.pid}; listening on {', '.join(info.listening)})")
        return info


def stop(port: Optional[int] = None, server_dir: Optional[os.PathLike] = None, *,
         purge: bool = False, timeout: float = STOP_TIMEOUT) -> Optional[int]:
    """Stop the server of server_dir (SIGTERM, then SIGKILL); the pid stopped, None if none
    ran. ``purge``: also delete the files this module made there, and the dir if then empty."""
    return KIND.stop(port, server_dir, purge=purge, timeout=timeout)


def status(port: Optional[int] = None, server_dir: Optional[os.PathLike] = None) -> dict:
    """{'state': 'up'|'starting'|'down', 'pid', 'url', ...}: up once the port answers."""
    port, server_dir, info, pid = KIND.observe(port, server_dir)
    state = "up" if pid and answers(port) else ("starting" if pid else "down")
    result = KIND.status(state, pid, port, url=url(port), server_dir=str(server_dir),
                         master=info.master if info else None,
                         spark_version=info.spark_version if info else None,
                         log=str(server_dir / "server.log"))
    if state == "down" and port_in_use(port):
        result["note"] = f"port {port} is in use by another process"
    return result


# --------------------------------------------------------------------------------------------
# command line


EPILOG = """\
examples:
  scripts/spark-connect start                  # sc://127.0.0.1:%(port)d, dir .cache/spark-connect/server-%(port)d
  scripts/spark-connect start --port 15010 --dir /tmp/sc --conf spark.sql.shuffle.partitions=2
  scripts/spark-connect status --port 15010 --json
  scripts/spark-connect stop --port 15010 --purge
  python -c 'from pyspark.sql import SparkSession
  spark = SparkSession.builder.remote("sc://127.0.0.1:%(port)d").getOrCreate()
  import sinks; sinks.register(spark)'

The server is pyspark's own SparkConnectServer (from <repo>/.venv) on 127.0.0.1 only, its
Python workers the venv's interpreter with the repository on PYTHONPATH (the cassandra_wal
data source runs there). Clients need pyspark[connect] (grpcio, ...).
The last line of `start`'s stdout is the sc:// URL; progress and errors go to stderr.
exit codes: 0 ok / up; 1 failure / down.
environment:
  CASSANDRA_WAL_CONNECT_CACHE      cache root instead of <repo>/.cache/spark-connect
  CASSANDRA_WAL_CONNECT_PYTHON     the Python (and its pyspark) instead of <repo>/.venv/bin/python
  CASSANDRA_WAL_CONNECT_JAVA_HOME  JDK to run the server with (default: the system JDK 17)
""" % {"port": DEFAULT_PORT}


def _parser() -> argparse.ArgumentParser:
    cli = local_server.CommandLine(
        "spark-connect",
        "Run a local Spark Connect server (pyspark's SparkConnectServer, local[2]) on 127.0.0.1 "
        "for development and tests.", EPILOG,
        port_help=f"gRPC port (default: the dir's recorded port, else {DEFAULT_PORT})",
        dir_dest="server_dir", dir_help="server directory (default: <cache>/server-<port>)")
    s = cli.command("start", "start a server (reports one already running)")
    s.add_argument("--master", default=DEFAULT_MASTER,
                   help=f"Spark master (default {DEFAULT_MASTER})")
    s.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the server's session (repeatable)")
    s.add_argument("--heap", default=DEFAULT_HEAP, help=f"driver heap (default {DEFAULT_HEAP})")
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for the port (default {DEFAULT_TIMEOUT:.0f})")
    cli.stop_command("stop the server (SIGTERM to its JVM, then SIGKILL)",
                     "also delete the server dir (state, pid file, log, tmp, warehouse)",
                     STOP_TIMEOUT)
    cli.command("status", "is the server up? (exit 0 up, 1 not)")
    return cli.parser


def _start_command(args) -> int:
    info = start(args.port, args.server_dir, master=args.master, conf=parse_conf(args.conf),
                 timeout=args.timeout, heap=args.heap)
    return local_server.answer(args, _state_json(info), info.url)


def main(argv: Optional[List[str]] = None) -> int:
    return local_server.main(
        _parser().parse_args(argv), KIND, start=_start_command, say_purged=True,
        status=lambda args: status(args.port, args.server_dir),
        up="up: pid {pid} at {url} (Spark {spark_version}, {master}, dir {server_dir})",
        starting="starting: pid {pid}, {url} not answering yet (log {log})")


if __name__ == "__main__":
    sys.exit(main())
