"""What the scripts that run a local server for development and tests share (stdlib only).

``scripts/cassandra`` (``cassandra_node.py``), ``scripts/hdfs`` (``hdfs_node.py``) and
``scripts/s3`` (``s3_server.py``) each run one server process per directory, the server dir,
in a session of its own. A :class:`ServerKind` says which files a script keeps there (a JSON
state file, a pid file, a ``.lock`` taken around start and stop, logs) and how its process is
recognised in /proc; with it the scripts find, launch, wait for, stop and purge their servers.
Also here: a script's cache folder (:class:`Cache`), ports on 127.0.0.1, a JDK and its
environment for the JVM servers, jars fetched once with Maven from a pom
(:class:`MavenJars`, :func:`pom_xml`), and the start/stop/status command line
(:class:`CommandLine`, :func:`main`).

The scripts import this module by name after putting their own folder on ``sys.path``, so it
is found however they are loaded (run as a program, or imported by path with importlib).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

HOST = "127.0.0.1"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
JARS_MARKER = ".complete"

T = TypeVar("T")


class ServerError(Exception):
    """A failure with a message meant for humans (each script raises a subclass of its own)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, with its folder, if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# processes and ports


def read_cmdline(pid: int) -> List[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def runs_with(pid: int, *args: str) -> bool:
    """Whether each of ``args`` is an argument on pid's command line."""
    cmdline = read_cmdline(pid)
    return all(a in cmdline for a in args)


def is_live(pid: int) -> bool:
    """False if pid is gone or a zombie (reaped first if it is our child)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def port_in_use(port: int, host: str = HOST, wildcard: bool = True) -> bool:
    """True if something holds (host, port) or, ``wildcard``, the wildcard address for it (a
    cluster's nodes share ports on several loopback addresses: the wildcard is theirs)."""
    for addr in (host, "0.0.0.0") if wildcard else (host,):
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
    """A port on 127.0.0.1 that is free now (none of ``exclude``)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


def wait_until(probe: Callable[[], Optional[T]], alive: Callable[[], bool], timeout: float,
               interval: float) -> Optional[T]:
    """Call ``probe`` every ``interval`` seconds until it returns something other than None,
    and return that; None as soon as ``alive()`` is False; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            return None
        result = probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# a kind of server, run from its server dir


@dataclass(frozen=True)
class Cache:
    """A script's cache folder (its jars, its servers' default dirs): ``$env_var`` if set,
    else ``<repo>/.cache/<name>``."""

    env_var: str
    name: str

    def root(self) -> Path:
        env = os.environ.get(self.env_var)
        repo = Path(__file__).resolve().parent.parent
        return Path(env).expanduser().resolve() if env else repo / ".cache" / self.name


@dataclass(frozen=True, kw_only=True)
class ServerKind:
    """One script's servers: where they live, the files a server dir holds, how the process is
    known, and how the command line speaks of one."""

    noun: str                               # "no <noun> running in <dir>"
    cache: Cache
    dir_prefix: str = "node"                # a port's default dir: <cache root>/<prefix>-<port>
    default_port: int
    state: type                             # the dataclass kept in state_file (has a port)
    to_json: Callable[[object], dict] = asdict  # what of a state goes into state_file
    dir_key: str    # the state's field for the server dir; also --dir's dest and the JSON key
    state_file: str
    pid_file: str
    files: Tuple[str, ...]  # what else the script makes in a server dir (purge deletes those,
    #                         the state, pid and lock files, then the dir if that empties it)
    matches: Callable[[int, Path], bool]    # (pid, server_dir): the live pid is its server
    tail: Callable[[Path], str]             # server_dir -> the tail of its logs
    error: type                             # the script's ServerError
    port_error: type                        # the script's error for a port in use

    def default_dir(self, port: int) -> Path:
        return self.cache.root() / f"{self.dir_prefix}-{port}"

    def resolve(self, port: Optional[int], server_dir: Optional[os.PathLike]) -> Tuple[int, Path]:
        """(port, server_dir): an explicit port wins, else the dir's recorded port, else the
        default; no dir: the default dir of that port."""
        if server_dir is None:
            port = port or self.default_port
            return port, self.default_dir(port)
        server_dir = Path(server_dir).expanduser().resolve()
        if port is None:
            info = self.load(server_dir)
            port = info.port if info else self.default_port
        return port, server_dir

    def require_free(self, *ports: Tuple[int, str], host: str = HOST,
                     wildcard: bool = True) -> None:
        """Raise ``port_error`` for the first of the (port, what) that something holds on
        ``host`` (:func:`port_in_use`)."""
        for port, what in ports:
            if port_in_use(port, host, wildcard):
                raise self.port_error(f"{what} {port} is in use by another process"
                                      + (f" on {host}" if host != HOST else ""))

    # -- files

    def lock(self, server_dir: Path):
        """The lock held while a start or a stop looks at and changes the server dir."""
        return flock(server_dir / ".lock")

    def load(self, server_dir: Path):
        """The recorded state (a ``state`` instance), None if missing or unreadable."""
        try:
            data = json.loads((server_dir / self.state_file).read_text())
        except (OSError, ValueError):
            return None
        known = {k: v for k, v in data.items() if k in self.state.__dataclass_fields__}
        try:
            return self.state(**known)
        except TypeError:
            return None

    def save(self, info) -> None:
        path = Path(getattr(info, self.dir_key)) / self.state_file
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(info), indent=2) + "\n")
        os.replace(tmp, path)

    def pid_path(self, server_dir: Path) -> Path:
        return server_dir / self.pid_file

    def read_pid(self, server_dir: Path) -> Optional[int]:
        try:
            return int(self.pid_path(server_dir).read_text().strip())
        except (OSError, ValueError):
            return None

    def purge(self, server_dir: Path) -> None:
        owned = (self.state_file, self.state_file + ".tmp", self.pid_file, ".lock", *self.files)
        for name in owned:
            path = server_dir / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            server_dir.rmdir()  # only if nothing else is in it

    # -- processes

    def is_ours(self, pid: int, server_dir: Path) -> bool:
        """True if pid is a live server of this kind for server_dir."""
        return is_live(pid) and self.matches(pid, server_dir)

    def still_ours(self, pid: Optional[int], server_dir: Path) -> Callable[[], bool]:
        """Whether pid is (still) this kind's server for server_dir, to ask again and again."""
        return lambda: bool(pid) and self.is_ours(pid, server_dir)

    def find_pids(self, server_dir: Path) -> List[int]:
        """All live servers of this kind for server_dir (a /proc scan)."""
        server_dir = Path(server_dir).resolve()
        return sorted(int(e) for e in os.listdir("/proc")
                      if e.isdigit() and self.is_ours(int(e), server_dir))

    def running_pid(self, server_dir: Path) -> Optional[int]:
        """Pid of this dir's live server (pid file first, then a /proc scan)."""
        pid = self.read_pid(server_dir)
        if pid and self.is_ours(pid, server_dir):
            return pid
        pids = self.find_pids(server_dir)
        return pids[0] if pids else None

    def running(self, server_dir: Path, *state_args):
        """Holding the lock: the state of server_dir's live server, with its pid (a new state
        of ``state_args`` if none is recorded); None if none runs (its pid file is then
        removed)."""
        pid = self.running_pid(server_dir)
        if not pid:
            self.pid_path(server_dir).unlink(missing_ok=True)
            return None
        info = self.load(server_dir) or self.state(str(server_dir), *state_args)
        info.pid = pid
        return info

    def refuse_other_port(self, info, port: int) -> None:
        """A running server (``info``) cannot serve a start on another port."""
        if info.port != port:
            raise self.error(
                f"{self.noun} in {getattr(info, self.dir_key)} is already running on port "
                f"{info.port} (pid {info.pid}); stop it first to use port {port}")

    def observe(self, port: Optional[int], server_dir: Optional[os.PathLike]) -> tuple:
        """For a status: (port, server_dir, recorded state, pid of the live server); the port
        is the running server's own."""
        port, server_dir = self.resolve(port, server_dir)
        if not server_dir.exists():
            return port, server_dir, None, None
        info, pid = self.load(server_dir), self.running_pid(server_dir)
        return (info.port if info and pid else port), server_dir, info, pid

    def status(self, state: str, pid: Optional[int], port: int, **more) -> dict:
        """A status as ``status --json`` prints it: state ('up', 'starting' or 'down'), pid,
        host, port, then ``more``."""
        return {"state": state, "pid": pid, "host": HOST, "port": port, **more}

    def launch(self, info, cmd: List[str], log_path: Path, env: dict) -> subprocess.Popen:
        """Start cmd in the server dir of ``info``, in a session of its own (a Ctrl-C in the
        terminal does not reach it), its output appended to log_path; record its pid (pid
        file, ``info.pid``, ``info.started_at``) and save ``info``."""
        server_dir = Path(getattr(info, self.dir_key))
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, cwd=server_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        self.pid_path(server_dir).write_text(f"{proc.pid}\n")
        info.pid, info.started_at = proc.pid, time.time()
        self.save(info)
        return proc

    def wait_launched(self, proc: subprocess.Popen, server_dir: Path,
                      probe: Callable[[], Optional[T]], *, timeout: float, interval: float,
                      what: str, not_ready: Callable[[], str], kill_timeout: float,
                      exited: str = "exited with code {}") -> T:
        """Wait until ``probe()`` returns something other than None, and return that. If the
        launched server exits first (``exited``, with its exit code) or ``timeout`` passes
        (``not_ready()``), kill it, forget its pid and raise ``error`` with ``what``, why, and
        the tail of its logs; a Ctrl-C while waiting kills it too."""
        try:
            result = wait_until(probe, lambda: proc.poll() is None, timeout, interval)
        except TimeoutError:
            result, why = None, not_ready()
        except BaseException:  # KeyboardInterrupt while waiting: do not leak the server
            self.abandon(proc, server_dir, kill_timeout)
            raise
        else:
            why = exited.format(proc.poll())
        if result is None:
            raise self.failed_start(proc, server_dir, f"{what} {why}", kill_timeout)
        return result

    def kill(self, pid: int, server_dir: Path, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; waits up to 10 s more for it to go."""
        if not self.is_ours(pid, server_dir):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_ours(pid, server_dir):
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.is_ours(pid, server_dir):
            time.sleep(0.1)

    def abandon(self, proc: subprocess.Popen, server_dir: Path, timeout: float) -> None:
        """Kill a server this process launched (a start that failed or was interrupted) and
        forget its pid."""
        self.kill(proc.pid, server_dir, timeout=timeout)
        proc.poll()
        self.pid_path(server_dir).unlink(missing_ok=True)

    def failed_start(self, proc: subprocess.Popen, server_dir: Path, why: str,
                     timeout: float) -> Exception:
        """:meth:`abandon` a server that did not come up; the error to raise: ``why`` and the
        tail of its logs (read before it is killed)."""
        logs = self.tail(server_dir)
        self.abandon(proc, server_dir, timeout)
        return self.error(f"{why}\n{logs}")

    def stop(self, port: Optional[int], server_dir: Optional[os.PathLike], *, purge: bool,
             timeout: float) -> Optional[int]:
        """Stop the server of --port/--dir (SIGTERM, then SIGKILL); the pid stopped, None if
        none ran. ``purge``: also delete the files of ``entries``, and the dir if then empty."""
        _, server_dir = self.resolve(port, server_dir)
        if not server_dir.exists():
            return None
        stopped = None
        with self.lock(server_dir):
            pids = set(self.find_pids(server_dir))
            pid = self.read_pid(server_dir)
            if pid and self.is_ours(pid, server_dir):
                pids.add(pid)
            for p in sorted(pids):
                self.kill(p, server_dir, timeout=timeout)
                if self.is_ours(p, server_dir):
                    raise self.error(f"could not stop pid {p}")
                stopped = stopped or p
            self.pid_path(server_dir).unlink(missing_ok=True)
        if purge:
            self.purge(server_dir)
        return stopped


def _tail(path: Path, lines: int) -> Optional[List[str]]:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    if not text:
        return []
    return [f"--- last {min(lines, len(text))} lines of {path} ---", *text[-lines:]]


def tail_log(path: Path, lines: int = 40) -> str:
    """The last lines of a log under a header; or that there is no log, or that it is empty."""
    tail = _tail(path, lines)
    if tail is None:
        return f"(no log at {path})"
    return "\n".join(tail) if tail else f"({path} is empty)"


def tail_logs(paths: Sequence[Path], lines: int, nothing: str) -> str:
    """:func:`tail_log` of each of the logs that has lines; ``nothing`` if none has."""
    return "\n".join(line for path in paths for line in _tail(path, lines) or []) or nothing


# --------------------------------------------------------------------------------------------
# Java and Maven


def java_major(home: Path) -> Optional[int]:
    """The major version of the JDK in home (from its ``release`` file), None if unknown."""
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


def find_java_home(override_var: str, also: Callable[[int], bool], none_found: str,
                   error: type) -> Path:
    """``$override_var`` if set; else the first JDK 17 among the system's JDKs
    (``/usr/lib/jvm/java-17-openjdk-amd64``, ``/usr/lib/jvm/*17*``, ``$JAVA_HOME``, the
    ``java`` on the PATH, ``/usr/lib/jvm/*``), else the first whose major version is ``also``
    accepts; else raise ``error(none_found)``."""
    override = os.environ.get(override_var)
    if override:
        home = Path(override)
        if not (home / "bin" / "java").exists():
            raise error(f"{override_var}={override} has no bin/java")
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
            major = java_major(home)
            if major == 17:
                return home
            if major and also(major):
                others.append(home)
    if others:
        return others[0]
    raise error(none_found)


def java_env(java_home: Path, *unset: str) -> dict:
    """This process's environment for a JVM of java_home, without what would change how the
    JVM runs (JVM options from the environment, a class path) and without ``unset``."""
    env = dict(os.environ, JAVA_HOME=str(java_home))
    for var in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "CLASSPATH", *unset):
        env.pop(var, None)
    return env


def pom_xml(artifact: str, comment: str, dependencies: Sequence[Tuple[str, str, str]]) -> str:
    """A pom-only Maven project ``local.cassandra-wal:<artifact>`` whose dependencies
    (group, artifact, version) are the jars to fetch; ``comment`` goes at its top."""
    deps = "".join(f"""\
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{name}</artifactId>
      <version>{version}</version>
    </dependency>
""" for group, name, version in dependencies)
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- {comment} -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.cassandra-wal</groupId>
  <artifactId>{artifact}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}  </dependencies>
</project>
"""


@dataclass(frozen=True, kw_only=True)
class MavenJars:
    """Jars that Maven's dependency plugin copies once from a pom into ``lib``.

    Maven copies into ``<lib>/../lib.partial-<pid>``, which becomes ``lib`` once it holds the
    jars, with a ``.complete`` marker (the jars, the pom's sha256, the fetch's time and size):
    a fetch that fails or is interrupted leaves no ``lib``; a changed pom fetches again.
    """

    lib: Path
    pom: Path                   # the pom Maven reads
    text: Optional[str] = None  # a generated pom, written to `pom` before a fetch (None: `pom`
    #                             is a file of the repository)
    what: str                   # "fetching <what> from Maven Central (one time, <cost>) ..."
    cost: str
    name: str                   # "<name> are not cached in <lib> and `mvn` is not on PATH ..."
    cache_env: str              # "... or point <cache_env> at a filled cache"
    needed: str                 # a fetch must bring a jar whose name starts so
    about: dict                 # the marker's first keys: what was fetched
    maven_args: Tuple[str, ...] = ()
    say_size: bool = False      # "fetched N jars (S MB) in T s" rather than "fetched N jars in T s"

    def pom_sha256(self) -> str:
        data = self.text.encode() if self.text is not None else self.pom.read_bytes()
        return hashlib.sha256(data).hexdigest()

    def marker(self) -> Optional[dict]:
        """The marker of a complete fetch of this pom (every jar it lists is there), else None."""
        try:
            marker = json.loads((self.lib / JARS_MARKER).read_text())
        except (OSError, ValueError):
            return None
        if marker.get("pom_sha256") != self.pom_sha256():
            return None
        jars = marker.get("jars") or []
        if not jars or not all((self.lib / j).is_file() for j in jars):
            return None
        return marker

    def ensure(self, error: type, say: Callable[[str], None] = log,
               java_home: Optional[Path] = None) -> dict:
        """The marker, fetching the jars first if they are not complete (under a lock, so
        that one process fetches); ``error`` if Maven is missing or fails."""
        marker = self.marker()
        if marker is not None:
            return marker
        with flock(self.lib.parent / ".fetch.lock"):
            marker = self.marker()  # another process may have fetched meanwhile
            if marker is not None:
                return marker
            mvn = shutil.which("mvn")
            if not mvn:
                raise error(f"{self.name} are not cached in {self.lib} and `mvn` is not on "
                            "PATH; install Maven (apt-get install maven) or point "
                            f"{self.cache_env} at a filled cache")
            if self.text is not None:
                self.pom.parent.mkdir(parents=True, exist_ok=True)
                self.pom.write_text(self.text)
            say(f"fetching {self.what} from Maven Central (one time, {self.cost}) into "
                f"{self.lib} ...")
            marker = self._fetch(mvn, error, java_home)
            size = f" ({marker['bytes'] / 1e6:.0f} MB)" if self.say_size else ""
            say(f"fetched {len(marker['jars'])} jars{size} in {marker['fetch_seconds']:.0f}s")
        return marker

    def _fetch(self, mvn: str, error: type, java_home: Optional[Path]) -> dict:
        t0 = time.monotonic()
        tmp = self.lib.parent / f"lib.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        env = dict(os.environ)
        if java_home:
            env["JAVA_HOME"] = str(java_home)
        cmd = [mvn, "-B", "-q", "-f", str(self.pom), DEPENDENCY_PLUGIN, *self.maven_args,
               f"-DoutputDirectory={tmp}"]
        # Captured (the scripts' stdout carries only their answer); shown if Maven fails.
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              stdin=subprocess.DEVNULL, text=True, errors="replace")
        jars = sorted(p.name for p in tmp.glob("*.jar")) if tmp.is_dir() else []
        if proc.returncode != 0 or not any(j.startswith(self.needed) for j in jars):
            shutil.rmtree(tmp, ignore_errors=True)
            output = "\n".join(proc.stdout.splitlines()[-40:])
            raise error(
                f"fetching jars failed (mvn exit {proc.returncode}): {' '.join(cmd)}\n{output}")
        marker = {**self.about, "pom_sha256": self.pom_sha256(), "jars": jars,
                  "bytes": sum((tmp / j).stat().st_size for j in jars),
                  "fetch_seconds": round(time.monotonic() - t0, 1),
                  "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / JARS_MARKER).write_text(json.dumps(marker, indent=1))
        shutil.rmtree(self.lib, ignore_errors=True)
        os.replace(tmp, self.lib)
        return marker


# --------------------------------------------------------------------------------------------
# the command line: start / stop / status (and what a script adds)


class CommandLine:
    """A script's argparse parser: subcommands that share --port, --dir and --json (the
    ``common`` parent) and show the script's epilog under their help."""

    FORMAT = argparse.RawDescriptionHelpFormatter

    def __init__(self, prog: str, description: str, epilog: str, *, port_help: str,
                 dir_dest: str, dir_help: str,
                 commands: Sequence[str] = ("start", "stop", "status")):
        self.epilog = epilog
        self.common = argparse.ArgumentParser(add_help=False)
        self.common.add_argument("--port", type=int, default=None, help=port_help)
        self.common.add_argument("--dir", dest=dir_dest, default=None, help=dir_help)
        self.common.add_argument("--json", action="store_true",
                                 help="print a JSON object on stdout")
        self.parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                              formatter_class=self.FORMAT)
        self._sub = self.parser.add_subparsers(dest="command", required=True,
                                               metavar="{" + ",".join(commands) + "}")

    def command(self, name: str, help: str, *parents: argparse.ArgumentParser,
                common: bool = True) -> argparse.ArgumentParser:
        parents = (self.common, *parents) if common else parents
        return self._sub.add_parser(name, parents=list(parents), help=help, epilog=self.epilog,
                                    formatter_class=self.FORMAT)

    def stop_command(self, help: str, purge_help: str,
                     timeout: float) -> argparse.ArgumentParser:
        t = self.command("stop", help)
        t.add_argument("--purge", action="store_true", help=purge_help)
        t.add_argument("--timeout", type=float, default=timeout,
                       help=f"seconds to wait after SIGTERM before SIGKILL (default {timeout:.0f})")
        return t


def main(args: argparse.Namespace, kind: ServerKind, *,
         start: Callable[[argparse.Namespace], int],
         status: Callable[[argparse.Namespace], dict], up: str, starting: str,
         more: Optional[Dict[str, Callable[[argparse.Namespace], int]]] = None,
         say_purged: bool = False) -> int:
    """Run a script's parsed command line; its exit code. ``start``: the script's; ``stop``:
    stop the server of --port/--dir; ``status``: the script's ``status(args)``, as JSON or as
    one line (:func:`_status_line`); ``more``: the script's other commands, by name. 1 after a
    ServerError (said on stderr), 130 after a Ctrl-C."""
    try:
        if args.command == "start":
            return start(args)
        if args.command == "stop":
            return _stop(kind, args, say_purged)
        if more and args.command in more:
            return more[args.command](args)
        st = status(args)
        print(json.dumps(st) if args.json else _status_line(kind, st, up, starting))
        return 0 if st["state"] == "up" else 1
    except ServerError as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130


def answer(args: argparse.Namespace, data: dict, line: str) -> int:
    """Print a command's answer on stdout: ``data`` as JSON with --json, else ``line``."""
    print(json.dumps(data) if args.json else line)
    return 0


def _stop(kind: ServerKind, args: argparse.Namespace, say_purged: bool) -> int:
    _, server_dir = kind.resolve(args.port, getattr(args, kind.dir_key))
    pid = kind.stop(args.port, server_dir, purge=args.purge, timeout=args.timeout)
    if args.json:
        print(json.dumps({"stopped_pid": pid, kind.dir_key: str(server_dir),
                          "purged": args.purge}))
    else:
        log((f"stopped pid {pid}" if pid else f"no {kind.noun} running in {server_dir}")
            + (f"; purged {server_dir}" if say_purged and args.purge else ""))
    return 0


def _status_line(kind: ServerKind, st: dict, up: str, starting: str) -> str:
    """A status in one line: ``up`` or ``starting`` (templates of the status's fields, a list
    as its items comma-separated or 'none'), the note after a starting one; or down."""
    note = st.get("note")
    if st["state"] == "down":
        return (f"down: no {kind.noun} running in {st[kind.dir_key]}"
                + (f" ({note})" if note else ""))
    fields = {k: (", ".join(v) or "none") if isinstance(v, list) else v for k, v in st.items()}
    if st["state"] == "up":
        return up.format_map(fields)
    return starting.format_map(fields) + (f"; {note}" if note else "")
