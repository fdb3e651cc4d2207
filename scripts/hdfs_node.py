"""Run a local single-node HDFS (a Hadoop MiniDFSCluster) from Maven Central jars (stdlib only).

Used by the ``scripts/hdfs`` command line and by ``tests/integration/test_hdfs_server.py``.
One JVM runs one namenode and one datanode (``org.apache.hadoop.test.MiniDFSClusterManager``
from ``hadoop-client-minicluster``, the Hadoop version inside pyspark 4.3.0). Layout:

* jars: ``<cache>/<version>/lib`` where ``<cache>`` is ``$HDFS_WAL_CACHE`` or
  ``<repo>/.cache/hdfs``; fetched once with Maven from a pom this module writes to
  ``<cache>/<version>/pom.xml``; a ``.complete`` marker is written after a successful copy.
* server dir (default ``<cache>/node-<port>``)::

      hdfs.json      ports, pid, listening addresses, options of the last start
      hdfs.pid       pid of the running JVM (removed by stop)
      details.json   written by MiniDFSClusterManager once the cluster is active
      data/          -Dtest.build.data and hadoop.tmp.dir: data/dfs/name-0-*, data/dfs/data/*
      logs/          stdout.log (JVM stdout/stderr, WARN and up, slf4j-simple)

The first start on a dir formats the namenode; later starts (after a ``stop`` without
``--purge``) reuse its metadata and blocks.

Everything binds 127.0.0.1: the namenode RPC port (``--port``), the namenode HTTP port with
WebHDFS (``--http-port``), and the datanode's data transfer, HTTP and IPC ports (free ports
picked at start, recorded in ``hdfs.json``). WebHDFS redirects a CREATE or OPEN to the
datanode's HTTP port on 127.0.0.1. ``start`` checks the JVM's listening sockets and refuses
(stops it) if any is bound elsewhere. Permissions are off (``dfs.permissions.enabled=false``):
any user name may write anywhere, as befits a throwaway test server.

Readiness: ``start`` waits until a small file can be created, read back and deleted through
WebHDFS (namenode up, out of safe mode, datanode registered). ``status`` asks WebHDFS for
``/`` and the namenode's JMX for its live datanodes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import json
import os
import struct
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

SCRIPTS_DIR = Path(__file__).resolve().parent
if str(SCRIPTS_DIR) not in sys.path:  # local_server.py, however this file is loaded
    sys.path.insert(0, str(SCRIPTS_DIR))

import local_server  # noqa: E402
from local_server import HOST, free_port, log, port_in_use  # noqa: E402, F401 (API)

HADOOP_VERSION = "3.5.0"
DEFAULT_PORT = 29000        # namenode RPC (hdfs://127.0.0.1:29000)
DEFAULT_HTTP_PORT = 29870   # namenode HTTP / WebHDFS
DEFAULT_TIMEOUT = 120.0
DEFAULT_HEAP = "256m"
STOP_TIMEOUT = 30.0
MAIN_CLASS = "org.apache.hadoop.test.MiniDFSClusterManager"
DIR_MARKER_PROP = "-Dhdfs_node.dir="    # on the JVM's command line: which server dir it serves
PROBE_PATH = "/.hdfs_node_probe"

CACHE = local_server.Cache("HDFS_WAL_CACHE", "hdfs")

# The jars: the shaded minicluster (it carries MiniDFSClusterManager) with the shaded client;
# MiniDFSCluster needs JUnit's assertion classes at run time (else NoClassDefFoundError:
# org/junit/jupiter/api/Assertions); slf4j-simple gives the otherwise silent JVM a log.
DEPENDENCIES = [
    *(("org.apache.hadoop", f"hadoop-client-{a}", HADOOP_VERSION)
      for a in ("minicluster", "runtime", "api")),
    ("org.junit.jupiter", "junit-jupiter-api", "5.11.4"),
    ("junit", "junit", "4.13.2"),
    ("org.slf4j", "slf4j-simple", "1.7.36"),
]


class HdfsNodeError(local_server.ServerError):
    """A start/stop failure with a message meant for humans."""


class PortInUseError(HdfsNodeError):
    pass


# --------------------------------------------------------------------------------------------
# paths, jars, java


def lib_dir(version: str = HADOOP_VERSION) -> Path:
    return CACHE.root() / version / "lib"


def pom_text() -> str:
    return local_server.pom_xml(
        "hdfs-node", "Written by scripts/hdfs_node.py; the jars of a local MiniDFSCluster "
        "(scripts/hdfs).", DEPENDENCIES)


def _jars() -> local_server.MavenJars:
    lib = lib_dir()
    return local_server.MavenJars(
        lib=lib, pom=lib.parent / "pom.xml", text=pom_text(), cost="~105 MB",
        what=f"Hadoop {HADOOP_VERSION} minicluster jars", name="HDFS jars",
        cache_env=CACHE.env_var, needed="hadoop-client-minicluster-",
        about={"version": HADOOP_VERSION})


def jars_complete() -> bool:
    return _jars().marker() is not None


def ensure_jars(java_home: Optional[Path] = None, say: Callable[[str], None] = log) -> Path:
    """Return the lib dir, fetching the jars with Maven if the cache is missing/incomplete."""
    _jars().ensure(HdfsNodeError, say=say, java_home=java_home)
    return lib_dir()


def find_java_home() -> Path:
    """A JDK for Hadoop 3.5: $HDFS_WAL_JAVA_HOME, else a JDK 17 (the one measured here), else
    $JAVA_HOME or the `java` on the PATH if it is 11 or newer."""
    return local_server.find_java_home(
        "HDFS_WAL_JAVA_HOME", also=lambda major: major >= 11, error=HdfsNodeError,
        none_found="no JDK 11 or newer found (JDK 17 preferred); set HDFS_WAL_JAVA_HOME")


# --------------------------------------------------------------------------------------------
# processes, sockets


def _dir_arg(node_dir: Path) -> str:
    return f"{DIR_MARKER_PROP}{node_dir}"



def _proc_net_addr(hexaddr: str) -> str:
    """'0100007F:7148' (from /proc/net/tcp[6], host byte order words) -> '127.0.0.1:29000'."""
    ip_hex, port_hex = hexaddr.split(":")
    words = b"".join(struct.pack("=I", int(ip_hex[i:i + 8], 16))
                     for i in range(0, len(ip_hex), 8))
    ip = ipaddress.ip_address(words)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return f"{ip}:{int(port_hex, 16)}" if ip.version == 4 else f"[{ip}]:{int(port_hex, 16)}"


def listening_addresses(pid: int) -> List[str]:
    """The TCP addresses pid listens on ('127.0.0.1:29000', '[::1]:1234', ...), sorted."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(_proc_net_addr(cols[1]))
    return sorted(set(found), key=lambda a: (a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])))


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host).is_loopback


# --------------------------------------------------------------------------------------------
# a minimal WebHDFS client (http.client: follows the namenode's 307 to the datanode itself)


class WebHdfsError(Exception):
    pass


def webhdfs(http_port: int, method: str, path: str, op: str, body: Optional[bytes] = None,
            timeout: float = 5.0, **params) -> Tuple[int, bytes]:
    """One WebHDFS call to the namenode on 127.0.0.1:http_port; a 307 (CREATE, OPEN, APPEND)
    is followed, with the body, to the datanode it names. Returns (status, body)."""
    query = urllib.parse.urlencode({"op": op, "user.name": "hdfs_node", **params})
    url = f"http://{HOST}:{http_port}/webhdfs/v1{urllib.parse.quote(path)}?{query}"
    for _ in range(3):
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            target = parts.path + ("?" + parts.query if parts.query else "")
            conn.request(method, target, body=body if method in ("PUT", "POST") else None,
                         headers={"Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status == 307:
                url = resp.getheader("Location") or ""
                if urllib.parse.urlsplit(url).hostname != HOST:
                    raise WebHdfsError(f"WebHDFS redirected to {url}, not to {HOST}")
                continue
            return resp.status, data
        finally:
            conn.close()
    raise WebHdfsError(f"too many redirects for {method} {path} op={op}")


def webhdfs_roundtrip(http_port: int, timeout: float = 5.0) -> Optional[str]:
    """Create, read back and delete a small file; None if that worked, else why not."""
    payload = f"hdfs_node probe {os.getpid()} {time.time()}\n".encode()
    try:
        status, data = webhdfs(http_port, "PUT", PROBE_PATH, "CREATE", payload,
                               timeout=timeout, overwrite="true")
        if status != 201:
            return f"CREATE answered {status}: {data[:300]!r}"
        status, data = webhdfs(http_port, "GET", PROBE_PATH, "OPEN", timeout=timeout)
        if status != 200 or data != payload:
            return f"OPEN answered {status}: {data[:300]!r}"
        status, data = webhdfs(http_port, "DELETE", PROBE_PATH, "DELETE", timeout=timeout)
        if status != 200:
            return f"DELETE answered {status}: {data[:300]!r}"
        return None
    except (OSError, http.client.HTTPException, WebHdfsError) as e:
        return f"{type(e).__name__}: {e}"


def live_datanodes(http_port: int, timeout: float = 3.0) -> Optional[int]:
    """NumLiveDataNodes from the namenode's JMX servlet; None if it does not answer."""
    try:
        conn = http.client.HTTPConnection(HOST, http_port, timeout=timeout)
        try:
            conn.request("GET", "/jmx?qry=Hadoop:service=NameNode,name=FSNamesystemState")
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            return None
        beans = json.loads(data).get("beans") or [{}]
        return int(beans[0].get("NumLiveDataNodes", 0))
    except (OSError, http.client.HTTPException, ValueError, TypeError):
        return None


def namenode_answers(http_port: int, timeout: float = 3.0) -> bool:
    try:
        status, _ = webhdfs(http_port, "GET", "/", "GETFILESTATUS", timeout=timeout)
        return status == 200
    except (OSError, http.client.HTTPException, WebHdfsError):
        return False


# --------------------------------------------------------------------------------------------
# server state


@dataclass
class NodeInfo:
    node_dir: str
    port: int                       # namenode RPC
    http_port: int = DEFAULT_HTTP_PORT
    pid: Optional[int] = None
    heap: str = DEFAULT_HEAP
    java: str = ""
    version: str = HADOOP_VERSION
    started_at: Optional[float] = None
    formatted: bool = False         # this start formatted the namenode (a fresh file system)
    listening: List[str] = field(default_factory=list)  # every address the JVM listens on
    extra: dict = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return f"hdfs://{HOST}:{self.port}"

    @property
    def webhdfs_url(self) -> str:
        return f"http://{HOST}:{self.http_port}/webhdfs/v1"

    @property
    def line(self) -> str:
        return f"{self.uri} {self.webhdfs_url}"





def is_formatted(node_dir: Path) -> bool:
    return (node_dir / "data" / "dfs" / "name-0-1" / "current" / "VERSION").is_file()


def java_command(info: NodeInfo, java_home: Path, lib: Path, format_fs: bool) -> List[str]:
    node_dir = Path(info.node_dir)
    data = node_dir / "data"
    cmd = [str(java_home / "bin" / "java"),
           f"-Xmx{info.heap}", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
           "-Djava.net.preferIPv4Stack=true",
           _dir_arg(node_dir),
           f"-Dtest.build.data={data}",
           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
           f"-Dorg.slf4j.simpleLogger.log.{MAIN_CLASS}=info",
           "-Dorg.slf4j.simpleLogger.showDateTime=true",
           "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
           "-cp", str(lib / "*"), MAIN_CLASS,
           "-nnport", str(info.port), "-httpport", str(info.http_port), "-datanodes", "1",
           "-writeDetails", str(node_dir / "details.json")]
    if format_fs:
        cmd.append("-format")
    conf = {
        "hadoop.tmp.dir": str(data),
        "dfs.webhdfs.enabled": "true",
        "dfs.permissions.enabled": "false",
        "dfs.replication": "1",
        # Loopback only (MiniDFSCluster already uses 127.0.0.1; said here so it stays so).
        "dfs.namenode.rpc-bind-host": HOST,
        "dfs.namenode.http-bind-host": HOST,
        "dfs.datanode.address": f"{HOST}:0",
        "dfs.datanode.http.address": f"{HOST}:0",
        "dfs.datanode.ipc.address": f"{HOST}:0",
        "dfs.datanode.hostname": HOST,  # WebHDFS redirects name the datanode by this
    }
    for key, value in conf.items():
        cmd += ["-D", f"{key}={value}"]
    return cmd


def tail_logs(node_dir: Path, lines: int = 40) -> str:
    return local_server.tail_log(Path(node_dir) / "logs" / "stdout.log", lines)


KIND = local_server.ServerKind(
    noun="HDFS", cache=CACHE, default_port=DEFAULT_PORT, state=NodeInfo, dir_key="node_dir",
    state_file="hdfs.json", pid_file="hdfs.pid", files=("data", "logs", "details.json"),
    matches=lambda pid, d: local_server.runs_with(pid, MAIN_CLASS, _dir_arg(d)),
    tail=tail_logs, error=HdfsNodeError, port_error=PortInUseError)


# --------------------------------------------------------------------------------------------
# start / stop / status


def resolve(port: Optional[int], node_dir: Optional[os.PathLike],
            http_port: Optional[int] = None) -> Tuple[int, Path, int]:
    """(port, node_dir, http_port): explicit options win, else the dir's recorded ports,
    else the defaults."""
    port, node_dir = KIND.resolve(port, node_dir)
    if http_port is None:
        info = KIND.load(node_dir)
        http_port = info.http_port if info and info.port == port else DEFAULT_HTTP_PORT
    return port, node_dir, http_port



def start(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None, *,
          http_port: Optional[int] = None, timeout: float = DEFAULT_TIMEOUT,
          heap: Optional[str] = None, quiet: bool = False) -> NodeInfo:
    """Start (or reuse) the HDFS of node_dir and wait until WebHDFS can write and read a file.

    The JVM runs in its own session (a Ctrl-C in the terminal does not reach it). A server
    already running for node_dir is reused (``info.extra['already_running']`` is True).
    Raises PortInUseError / HdfsNodeError on failure, leaving no JVM behind.
    """
    port, node_dir, http_port = resolve(port, node_dir, http_port)
    heap = heap or os.environ.get("HDFS_WAL_HEAP") or DEFAULT_HEAP
    say = (lambda m: None) if quiet else log
    if port == http_port:
        raise HdfsNodeError(f"--port and --http-port are both {port}")
    created = not node_dir.exists()
    node_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _start_locked(port, node_dir, http_port, timeout, heap, say)
    except BaseException:
        if created:  # a start that failed in a new dir leaves nothing behind
            stop(port, node_dir, purge=True)
        raise


def _start_locked(port: int, node_dir: Path, http_port: int, timeout: float, heap: str,
                  say: Callable[[str], None]) -> NodeInfo:
    with KIND.lock(node_dir):
        info = KIND.running(node_dir, port, http_port)
        if info:
            pid = info.pid
            if (info.port, info.http_port) != (port, http_port):
                raise HdfsNodeError(
                    f"HDFS in {node_dir} is already running on ports {info.port}/"
                    f"{info.http_port} (pid {pid}); stop it first to use {port}/{http_port}")
            say(f"HDFS in {node_dir} is already running (pid {pid}) on {info.uri}")
            probe, not_ready = _readiness(info, timeout)
            try:
                ready = local_server.wait_until(probe, KIND.still_ours(pid, node_dir), timeout,
                                                interval=0.5)
                why = None if ready else "exited while starting"
            except TimeoutError:
                why = not_ready()
            if why:
                raise HdfsNodeError(f"HDFS in {node_dir} (pid {pid}) runs but is not ready: "
                                    f"{why}\n" + tail_logs(node_dir))
            info.extra["already_running"] = True
            return info
        KIND.require_free((port, "namenode port"), (http_port, "http port"))

        java_home = find_java_home()
        lib = ensure_jars(java_home, say=say)

        format_fs = not is_formatted(node_dir)
        info = NodeInfo(node_dir=str(node_dir), port=port, http_port=http_port, heap=heap,
                        java=str(java_home / "bin" / "java"), formatted=format_fs)
        (node_dir / "logs").mkdir(exist_ok=True)
        (node_dir / "data").mkdir(exist_ok=True)
        (node_dir / "details.json").unlink(missing_ok=True)
        cmd = java_command(info, java_home, lib, format_fs)
        say(f"starting HDFS (Hadoop {HADOOP_VERSION} MiniDFSCluster, 1 datanode) on {info.uri}, "
            f"WebHDFS {info.webhdfs_url} (dir {node_dir}, "
            f"{'new file system' if format_fs else 'existing file system'}) ...")
        proc = KIND.launch(info, cmd, node_dir / "logs" / "stdout.log",
                           local_server.java_env(java_home, "HADOOP_CONF_DIR", "HADOOP_HOME"))
        probe, not_ready = _readiness(info, timeout, say)
        KIND.wait_launched(proc, node_dir, probe, timeout=timeout, interval=0.5,
                           what=f"HDFS in {node_dir}", not_ready=not_ready, kill_timeout=10,
                           exited="exited with code {} while starting")
        info.listening = listening_addresses(proc.pid)
        outside = [a for a in info.listening if not is_loopback(a)]
        if outside:
            raise KIND.failed_start(proc, node_dir, f"HDFS in {node_dir} it listens on "
                                    f"non-loopback addresses {outside}; stopped it", timeout=10)
        info.extra = {"startup_seconds": round(time.time() - info.started_at, 1)}
        KIND.save(info)
        say(f"HDFS is up on {info.uri} after {info.extra['startup_seconds']}s (pid {proc.pid}; "
            f"listening on {', '.join(info.listening)})")
        return info


def _readiness(info: NodeInfo, timeout: float,
               say: Callable[[str], None] = lambda m: None) -> tuple:
    """(probe, not_ready) for waiting until a WebHDFS create/read/delete round trip works:
    probe() is True once it does, None until then; not_ready() says why it did not in time."""
    last, announced = "no answer yet", False

    def probe() -> Optional[bool]:
        nonlocal last, announced
        if not namenode_answers(info.http_port):
            return None
        if not announced:
            say("namenode answers WebHDFS; waiting for the datanode ...")
            announced = True
        problem = webhdfs_roundtrip(info.http_port)
        if problem is None:
            return True
        last = problem
        return None

    return probe, lambda: f"was not ready within {timeout:.0f}s (last WebHDFS probe: {last})"


def stop(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None, *,
         purge: bool = False, timeout: float = STOP_TIMEOUT) -> Optional[int]:
    """Stop the HDFS of node_dir (SIGTERM, then SIGKILL); returns the pid stopped (None if
    none ran). purge: also delete its data, logs and state files."""
    return KIND.stop(port, node_dir, purge=purge, timeout=timeout)


def status(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None,
           http_port: Optional[int] = None) -> dict:
    """{'state': 'up'|'starting'|'down', 'pid', 'uri', 'webhdfs', ...}. Up: the JVM runs,
    WebHDFS answers and at least one datanode is live."""
    port, node_dir, info, pid = KIND.observe(port, node_dir)
    http_port = info.http_port if info and pid else resolve(port, node_dir, http_port)[2]
    answers = bool(pid) and namenode_answers(http_port)
    datanodes = live_datanodes(http_port) if answers else None
    state = "up" if answers and datanodes else ("starting" if pid else "down")
    probe = NodeInfo(str(node_dir), port, http_port)
    result = KIND.status(
        state, pid, port, http_port=http_port, uri=probe.uri, webhdfs=probe.webhdfs_url,
        node_dir=str(node_dir), live_datanodes=datanodes,
        listening=listening_addresses(pid) if pid else [],
        log=str(node_dir / "logs" / "stdout.log"))
    if state == "down":
        busy = [str(p) for p in (port, http_port) if port_in_use(p)]
        if busy:
            result["note"] = f"port {' and '.join(busy)} in use by another process"
    return result


# --------------------------------------------------------------------------------------------
# command line


EPILOG = """\
examples:
  scripts/hdfs start                          # hdfs://127.0.0.1:%(port)d, WebHDFS on :%(http)d,
                                              # dir .cache/hdfs/node-%(port)d
  scripts/hdfs start --port 29100 --http-port 29970 --dir /tmp/h1
  read HDFS_URI WEBHDFS_URL < <(scripts/hdfs start --dir /tmp/h1)
  curl "$WEBHDFS_URL/?op=LISTSTATUS"
  spark ... .option("checkpointLocation", "hdfs://127.0.0.1:%(port)d/cp")
  scripts/hdfs status --dir /tmp/h1 --json
  scripts/hdfs stop --dir /tmp/h1             # keeps the file system for the next start
  scripts/hdfs stop --dir /tmp/h1 --purge     # and deletes its data

stdout of `start` is one line: the hdfs:// URI and the WebHDFS URL; progress and errors go
to stderr. A start on a dir whose server runs already says so and starts nothing.
binds: 127.0.0.1 only: the namenode RPC port (--port), the namenode HTTP port with WebHDFS
  and /jmx (--http-port), and the datanode's data transfer, HTTP and IPC ports (free ports,
  listed in <dir>/hdfs.json; WebHDFS redirects reads and writes to the datanode's HTTP port
  on 127.0.0.1). Permissions are off: any user may write anywhere.
exit codes: 0 ok / up; 1 failure / down.
environment:
  HDFS_WAL_CACHE      cache root instead of <repo>/.cache/hdfs (jars in <root>/%(version)s/lib)
  HDFS_WAL_JAVA_HOME  JDK to run HDFS with (default: the system JDK 17)
  HDFS_WAL_HEAP       JVM heap (default %(heap)s)
""" % {"port": DEFAULT_PORT, "http": DEFAULT_HTTP_PORT, "version": HADOOP_VERSION,
       "heap": DEFAULT_HEAP}


def _parser() -> argparse.ArgumentParser:
    cli = local_server.CommandLine(
        "hdfs",
        f"Run a local single-node HDFS (Hadoop {HADOOP_VERSION} MiniDFSCluster: one namenode "
        "and one datanode in one JVM; jars from Maven Central) for development and tests.",
        EPILOG,
        port_help=f"namenode RPC port (default: the dir's recorded port, else {DEFAULT_PORT})",
        dir_dest="node_dir", dir_help="server directory (default: <cache>/node-<port>)")
    http = argparse.ArgumentParser(add_help=False)
    http.add_argument("--http-port", type=int, default=None,
                      help=f"namenode HTTP / WebHDFS port (default: the dir's recorded port, "
                           f"else {DEFAULT_HTTP_PORT})")
    s = cli.command("start", "start HDFS (no-op if already running)", http)
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for WebHDFS (default {DEFAULT_TIMEOUT:.0f})")
    s.add_argument("--heap", default=None, help=f"JVM heap, e.g. 256m, 1g (default {DEFAULT_HEAP})")
    cli.stop_command("stop HDFS (SIGTERM, then SIGKILL)",
                     "also delete its data (the file system), logs and state files", STOP_TIMEOUT)
    cli.command("status", "is HDFS up? (exit 0 up, 1 not)", http)
    return cli.parser


def _start_command(args) -> int:
    info = start(args.port, args.node_dir, http_port=args.http_port, timeout=args.timeout,
                 heap=args.heap)
    return local_server.answer(
        args, {"uri": info.uri, "webhdfs": info.webhdfs_url, "host": HOST, **asdict(info)},
        info.line)


def main(argv: Optional[List[str]] = None) -> int:
    return local_server.main(
        _parser().parse_args(argv), KIND, start=_start_command, say_purged=True,
        status=lambda args: status(args.port, args.node_dir, args.http_port),
        up="up: pid {pid} at {uri} {webhdfs} ({live_datanodes} live datanode, dir {node_dir})",
        starting="starting: pid {pid}, {webhdfs} not ready yet (log {log})")


if __name__ == "__main__":
    sys.exit(main())
