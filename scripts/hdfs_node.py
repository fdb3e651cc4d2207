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
import errno
import fcntl
import glob
import hashlib
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

HADOOP_VERSION = "3.5.0"
HOST = "127.0.0.1"
DEFAULT_PORT = 29000        # namenode RPC (hdfs://127.0.0.1:29000)
DEFAULT_HTTP_PORT = 29870   # namenode HTTP / WebHDFS
DEFAULT_TIMEOUT = 120.0
DEFAULT_HEAP = "256m"
STOP_TIMEOUT = 30.0
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
MAIN_CLASS = "org.apache.hadoop.test.MiniDFSClusterManager"
DIR_MARKER_PROP = "-Dhdfs_node.dir="    # on the JVM's command line: which server dir it serves
PROBE_PATH = "/.hdfs_node_probe"

SCRIPTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPTS_DIR.parent
MARKER = ".complete"

# Files/dirs that this module creates in a server dir (purge removes only these).
_NODE_ENTRIES = ("data", "logs", "hdfs.json", "hdfs.pid", "details.json", ".lock")

# The jars: the shaded minicluster (it carries MiniDFSClusterManager) with the shaded client;
# MiniDFSCluster needs JUnit's assertion classes at run time (else NoClassDefFoundError:
# org/junit/jupiter/api/Assertions); slf4j-simple gives the otherwise silent JVM a log.
POM_TEMPLATE = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by scripts/hdfs_node.py; the jars of a local MiniDFSCluster (scripts/hdfs). -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.cassandra-wal</groupId>
  <artifactId>hdfs-node</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-client-minicluster</artifactId>
      <version>{hadoop}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-client-runtime</artifactId>
      <version>{hadoop}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-client-api</artifactId>
      <version>{hadoop}</version>
    </dependency>
    <dependency>
      <groupId>org.junit.jupiter</groupId>
      <artifactId>junit-jupiter-api</artifactId>
      <version>5.11.4</version>
    </dependency>
    <dependency>
      <groupId>junit</groupId>
      <artifactId>junit</artifactId>
      <version>4.13.2</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>1.7.36</version>
    </dependency>
  </dependencies>
</project>
"""


class HdfsNodeError(Exception):
    """A start/stop failure with a message meant for humans."""


class PortInUseError(HdfsNodeError):
    pass


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# paths, jars, java


def cache_root() -> Path:
    env = os.environ.get("HDFS_WAL_CACHE")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache" / "hdfs"


def lib_dir(version: str = HADOOP_VERSION) -> Path:
    return cache_root() / version / "lib"


def default_node_dir(port: int) -> Path:
    return cache_root() / f"node-{port}"


def pom_text() -> str:
    return POM_TEMPLATE.format(hadoop=HADOOP_VERSION)


def _pom_digest() -> str:
    return hashlib.sha256(pom_text().encode()).hexdigest()


def jars_complete(lib: Optional[Path] = None) -> bool:
    lib = lib or lib_dir()
    try:
        marker = json.loads((lib / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("pom_sha256") != _pom_digest():
        return False
    jars = marker.get("jars") or []
    return bool(jars) and all((lib / j).is_file() for j in jars)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_jars(java_home: Optional[Path] = None, say: Callable[[str], None] = log) -> Path:
    """Return the lib dir, fetching the jars with Maven if the cache is missing/incomplete."""
    lib = lib_dir()
    if jars_complete(lib):
        return lib
    with _flock(lib.parent / ".fetch.lock"):
        if jars_complete(lib):  # another process fetched meanwhile
            return lib
        mvn = shutil.which("mvn")
        if not mvn:
            raise HdfsNodeError(
                f"HDFS jars are not cached in {lib} and `mvn` is not on PATH; install Maven "
                "(apt-get install maven) or point HDFS_WAL_CACHE at a filled cache")
        pom = lib.parent / "pom.xml"
        pom.write_text(pom_text())
        say(f"fetching Hadoop {HADOOP_VERSION} minicluster jars from Maven Central "
            f"(one time, ~105 MB) into {lib} ...")
        t0 = time.monotonic()
        tmp = lib.parent / f"lib.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        env = dict(os.environ)
        if java_home:
            env["JAVA_HOME"] = str(java_home)
        cmd = [mvn, "-B", "-q", "-f", str(pom), DEPENDENCY_PLUGIN, f"-DoutputDirectory={tmp}"]
        # Captured (our stdout carries only the URIs); shown if Maven fails.
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              stdin=subprocess.DEVNULL, text=True, errors="replace")
        jars = sorted(p.name for p in tmp.glob("*.jar")) if tmp.is_dir() else []
        if proc.returncode != 0 or not any(j.startswith("hadoop-client-minicluster-")
                                           for j in jars):
            shutil.rmtree(tmp, ignore_errors=True)
            output = "\n".join(proc.stdout.splitlines()[-40:])
            raise HdfsNodeError(
                f"fetching jars failed (mvn exit {proc.returncode}): {' '.join(cmd)}\n{output}")
        (tmp / MARKER).write_text(json.dumps(
            {"version": HADOOP_VERSION, "pom_sha256": _pom_digest(), "jars": jars,
             "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
        shutil.rmtree(lib, ignore_errors=True)
        os.replace(tmp, lib)
        say(f"fetched {len(jars)} jars in {time.monotonic() - t0:.0f}s")
    return lib


def _java_major(home: Path) -> Optional[int]:
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("JAVA_VERSION="):
            v = line.split("=", 1)[1].strip().strip('"')
            head = v.split(".")[0]
            if head == "1":  # 1.8.0
                head = v.split(".")[1]
            try:
                return int(head)
            except ValueError:
                return None
    return None


def find_java_home() -> Path:
    """A JDK for Hadoop 3.5: $HDFS_WAL_JAVA_HOME, else a JDK 17 (the one measured here), else
    $JAVA_HOME or the `java` on the PATH if it is 11 or newer."""
    override = os.environ.get("HDFS_WAL_JAVA_HOME")
    if override:
        home = Path(override)
        if not (home / "bin" / "java").exists():
            raise HdfsNodeError(f"HDFS_WAL_JAVA_HOME={override} has no bin/java")
        return home
    candidates: List[Path] = [Path("/usr/lib/jvm/java-17-openjdk-amd64")]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/jvm/*17*"))]
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    java = shutil.which("java")
    if java:
        candidates.append(Path(os.path.realpath(java)).parent.parent)
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/jvm/*"))]
    others = []
    for home in candidates:
        if (home / "bin" / "java").exists():
            major = _java_major(home)
            if major == 17:
                return home
            if major and major >= 11:
                others.append(home)
    if others:
        return others[0]
    raise HdfsNodeError("no JDK 11 or newer found (JDK 17 preferred); set HDFS_WAL_JAVA_HOME")


# --------------------------------------------------------------------------------------------
# processes, ports, sockets


def _read_cmdline(pid: int) -> List[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _dir_arg(node_dir: Path) -> str:
    return f"{DIR_MARKER_PROP}{node_dir}"


def is_our_process(pid: int, node_dir: Path) -> bool:
    """True if pid is a live MiniDFSClusterManager JVM started for node_dir."""
    _reap(pid)
    if _is_zombie(pid):
        return False
    args = _read_cmdline(pid)
    return MAIN_CLASS in args and _dir_arg(node_dir) in args


def find_node_pids(node_dir: Path) -> List[int]:
    """All live MiniDFSClusterManager JVMs started for node_dir."""
    node_dir = Path(node_dir).resolve()
    return sorted(int(e) for e in os.listdir("/proc")
                  if e.isdigit() and is_our_process(int(e), node_dir))


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something holds (host, port) or the wildcard address for it."""
    for addr in (host, "0.0.0.0"):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT
            s.bind((addr, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
        finally:
            s.close()
    return False


def free_port(exclude: Tuple[int, ...] = ()) -> int:
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


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


def _info_file(node_dir: Path) -> Path:
    return node_dir / "hdfs.json"


def _pid_file(node_dir: Path) -> Path:
    return node_dir / "hdfs.pid"


def load_info(node_dir: Path) -> Optional[NodeInfo]:
    try:
        data = json.loads(_info_file(node_dir).read_text())
    except (OSError, ValueError):
        return None
    known = {k: v for k, v in data.items() if k in NodeInfo.__dataclass_fields__}
    try:
        return NodeInfo(**known)
    except TypeError:
        return None


def _save_info(info: NodeInfo) -> None:
    path = _info_file(Path(info.node_dir))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2) + "\n")
    os.replace(tmp, path)


def read_pid(node_dir: Path) -> Optional[int]:
    try:
        return int(_pid_file(node_dir).read_text().strip())
    except (OSError, ValueError):
        return None


def running_pid(node_dir: Path) -> Optional[int]:
    """Pid of this dir's live JVM (pid file first, then a /proc scan)."""
    pid = read_pid(node_dir)
    if pid and is_our_process(pid, node_dir):
        return pid
    pids = find_node_pids(node_dir)
    return pids[0] if pids else None


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
    path = Path(node_dir) / "logs" / "stdout.log"
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    if not text:
        return f"({path} is empty)"
    return "\n".join([f"--- last {min(lines, len(text))} lines of {path} ---", *text[-lines:]])


# --------------------------------------------------------------------------------------------
# start / stop / status


def resolve(port: Optional[int], node_dir: Optional[os.PathLike],
            http_port: Optional[int] = None) -> Tuple[int, Path, int]:
    """(port, node_dir, http_port): explicit options win, else the dir's recorded ports,
    else the defaults."""
    if node_dir is None:
        port = port or DEFAULT_PORT
        node_dir = default_node_dir(port)
    else:
        node_dir = Path(node_dir).expanduser().resolve()
    info = load_info(node_dir)
    if port is None:
        port = info.port if info else DEFAULT_PORT
    if http_port is None:
        http_port = info.http_port if info and info.port == port else DEFAULT_HTTP_PORT
    return port, node_dir, http_port


def _kill(pid: int, node_dir: Path, timeout: float = STOP_TIMEOUT) -> None:
    if not is_our_process(pid, node_dir):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_our_process(pid, node_dir):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and is_our_process(pid, node_dir):
        time.sleep(0.1)


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
    with _flock(node_dir / ".lock"):
        pid = running_pid(node_dir)
        if pid:
            info = load_info(node_dir) or NodeInfo(str(node_dir), port, http_port)
            info.pid = pid
            if (info.port, info.http_port) != (port, http_port):
                raise HdfsNodeError(
                    f"HDFS in {node_dir} is already running on ports {info.port}/"
                    f"{info.http_port} (pid {pid}); stop it first to use {port}/{http_port}")
            say(f"HDFS in {node_dir} is already running (pid {pid}) on {info.uri}")
            why = _wait_ready(info, timeout, alive=lambda: is_our_process(pid, node_dir))
            if why:
                raise HdfsNodeError(f"HDFS in {node_dir} (pid {pid}) runs but is not ready: "
                                    f"{why}\n" + tail_logs(node_dir))
            info.extra["already_running"] = True
            return info
        _pid_file(node_dir).unlink(missing_ok=True)

        for p, what in ((port, "namenode port"), (http_port, "http port")):
            if port_in_use(p):
                raise PortInUseError(f"{what} {p} is in use by another process")

        java_home = find_java_home()
        lib = ensure_jars(java_home, say=say)

        format_fs = not is_formatted(node_dir)
        info = NodeInfo(node_dir=str(node_dir), port=port, http_port=http_port, heap=heap,
                        java=str(java_home / "bin" / "java"), formatted=format_fs)
        (node_dir / "logs").mkdir(exist_ok=True)
        (node_dir / "data").mkdir(exist_ok=True)
        (node_dir / "details.json").unlink(missing_ok=True)
        cmd = java_command(info, java_home, lib, format_fs)
        env = dict(os.environ, JAVA_HOME=str(java_home))
        for var in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "CLASSPATH",
                    "HADOOP_CONF_DIR", "HADOOP_HOME"):
            env.pop(var, None)
        say(f"starting HDFS (Hadoop {HADOOP_VERSION} MiniDFSCluster, 1 datanode) on {info.uri}, "
            f"WebHDFS {info.webhdfs_url} (dir {node_dir}, "
            f"{'new file system' if format_fs else 'existing file system'}) ...")
        with open(node_dir / "logs" / "stdout.log", "ab") as out:
            proc = subprocess.Popen(cmd, cwd=node_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        info.pid = proc.pid
        info.started_at = time.time()
        _pid_file(node_dir).write_text(f"{proc.pid}\n")
        _save_info(info)
        try:
            why = _wait_ready(info, timeout, alive=lambda: proc.poll() is None, say=say)
            if why is None:
                info.listening = listening_addresses(proc.pid)
                outside = [a for a in info.listening if not is_loopback(a)]
                if outside:
                    why = f"it listens on non-loopback addresses {outside}; stopped it"
        except BaseException:  # KeyboardInterrupt while waiting: do not leak the JVM
            _kill(proc.pid, node_dir, timeout=10)
            proc.poll()
            _pid_file(node_dir).unlink(missing_ok=True)
            raise
        if why:
            if proc.poll() is not None:
                why = f"exited with code {proc.returncode} while starting"
            logs = tail_logs(node_dir)
            _kill(proc.pid, node_dir, timeout=10)
            proc.poll()
            _pid_file(node_dir).unlink(missing_ok=True)
            raise HdfsNodeError(f"HDFS in {node_dir} {why}\n{logs}")
        info.extra = {"startup_seconds": round(time.time() - info.started_at, 1)}
        _save_info(info)
        say(f"HDFS is up on {info.uri} after {info.extra['startup_seconds']}s (pid {proc.pid}; "
            f"listening on {', '.join(info.listening)})")
        return info


def _wait_ready(info: NodeInfo, timeout: float, alive: Callable[[], bool],
                say: Callable[[str], None] = lambda m: None) -> Optional[str]:
    """Wait until a WebHDFS create/read/delete round trip works. None when ready, else why not
    (the JVM exited, or the timeout passed)."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    announced = False
    while True:
        if not alive():
            return "exited while starting"
        if namenode_answers(info.http_port):
            if not announced:
                say("namenode answers WebHDFS; waiting for the datanode ...")
                announced = True
            problem = webhdfs_roundtrip(info.http_port)
            if problem is None:
                return None
            last = problem
        if time.monotonic() >= deadline:
            return f"was not ready within {timeout:.0f}s (last WebHDFS probe: {last})"
        time.sleep(0.5)


def stop(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None, *,
         purge: bool = False, timeout: float = STOP_TIMEOUT) -> Optional[int]:
    """Stop the HDFS of node_dir (SIGTERM, then SIGKILL); returns the pid stopped (None if
    none ran). purge: also delete its data, logs and state files."""
    _, node_dir, _ = resolve(port, node_dir)
    if not node_dir.exists():
        return None
    stopped = None
    with _flock(node_dir / ".lock"):
        pids = set(find_node_pids(node_dir))
        pid = read_pid(node_dir)
        if pid and is_our_process(pid, node_dir):
            pids.add(pid)
        for p in sorted(pids):
            _kill(p, node_dir, timeout=timeout)
            if is_our_process(p, node_dir):
                raise HdfsNodeError(f"could not stop pid {p}")
            stopped = stopped or p
        _pid_file(node_dir).unlink(missing_ok=True)
    if purge:
        for name in _NODE_ENTRIES:
            path = node_dir / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            node_dir.rmdir()  # only if nothing else is in it
    return stopped


def status(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None,
           http_port: Optional[int] = None) -> dict:
    """{'state': 'up'|'starting'|'down', 'pid', 'uri', 'webhdfs', ...}. Up: the JVM runs,
    WebHDFS answers and at least one datanode is live."""
    port, node_dir, http_port = resolve(port, node_dir, http_port)
    info = load_info(node_dir) if node_dir.exists() else None
    pid = running_pid(node_dir) if node_dir.exists() else None
    if info and pid:
        port, http_port = info.port, info.http_port
    answers = bool(pid) and namenode_answers(http_port)
    datanodes = live_datanodes(http_port) if answers else None
    state = "up" if answers and datanodes else ("starting" if pid else "down")
    probe = NodeInfo(str(node_dir), port, http_port)
    result = {
        "state": state,
        "pid": pid,
        "host": HOST,
        "port": port,
        "http_port": http_port,
        "uri": probe.uri,
        "webhdfs": probe.webhdfs_url,
        "node_dir": str(node_dir),
        "live_datanodes": datanodes,
        "listening": listening_addresses(pid) if pid else [],
        "log": str(node_dir / "logs" / "stdout.log"),
    }
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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--port", type=int, default=None,
                        help=f"namenode RPC port (default: the dir's recorded port, "
                             f"else {DEFAULT_PORT})")
    common.add_argument("--dir", dest="node_dir", default=None,
                        help="server directory (default: <cache>/node-<port>)")
    common.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    http = argparse.ArgumentParser(add_help=False)
    http.add_argument("--http-port", type=int, default=None,
                      help=f"namenode HTTP / WebHDFS port (default: the dir's recorded port, "
                           f"else {DEFAULT_HTTP_PORT})")
    p = argparse.ArgumentParser(
        prog="hdfs",
        description=f"Run a local single-node HDFS (Hadoop {HADOOP_VERSION} MiniDFSCluster: "
                    "one namenode and one datanode in one JVM; jars from Maven Central) for "
                    "development and tests.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{start,stop,status}")
    s = sub.add_parser("start", parents=[common, http],
                       help="start HDFS (no-op if already running)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for WebHDFS (default {DEFAULT_TIMEOUT:.0f})")
    s.add_argument("--heap", default=None, help=f"JVM heap, e.g. 256m, 1g (default {DEFAULT_HEAP})")
    t = sub.add_parser("stop", parents=[common], help="stop HDFS (SIGTERM, then SIGKILL)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--purge", action="store_true",
                   help="also delete its data (the file system), logs and state files")
    t.add_argument("--timeout", type=float, default=STOP_TIMEOUT,
                   help="seconds to wait after SIGTERM before SIGKILL "
                        f"(default {STOP_TIMEOUT:.0f})")
    sub.add_parser("status", parents=[common, http], help="is HDFS up? (exit 0 up, 1 not)",
                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "start":
            info = start(args.port, args.node_dir, http_port=args.http_port,
                         timeout=args.timeout, heap=args.heap)
            if args.json:
                print(json.dumps({"uri": info.uri, "webhdfs": info.webhdfs_url, "host": HOST,
                                  **asdict(info)}))
            else:
                print(info.line)
            return 0
        if args.command == "stop":
            pid = stop(args.port, args.node_dir, purge=args.purge, timeout=args.timeout)
            _, node_dir, _ = resolve(args.port, args.node_dir)
            if args.json:
                print(json.dumps({"stopped_pid": pid, "node_dir": str(node_dir),
                                  "purged": args.purge}))
            else:
                log((f"stopped pid {pid}" if pid else f"no HDFS running in {node_dir}")
                    + (f"; purged {node_dir}" if args.purge else ""))
            return 0
        st = status(args.port, args.node_dir, args.http_port)
        if args.json:
            print(json.dumps(st))
        elif st["state"] == "up":
            print(f"up: pid {st['pid']} at {st['uri']} {st['webhdfs']} "
                  f"({st['live_datanodes']} live datanode, dir {st['node_dir']})")
        elif st["state"] == "starting":
            print(f"starting: pid {st['pid']}, {st['webhdfs']} not ready yet (log {st['log']})")
        else:
            print(f"down: no HDFS running in {st['node_dir']}"
                  + (f" ({st['note']})" if st.get("note") else ""))
        return 0 if st["state"] == "up" else 1
    except HdfsNodeError as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
