"""Run a local Apache Cassandra cluster of several nodes on loopback addresses (stdlib only).

``scripts/cassandra cluster start|stop|status|kill|restart``; the single-node commands are in
``cassandra_node.py``, and every node here is one of its nodes (same jars, JVM flags, yaml,
probe), started with a host, a storage port and a membership of the cluster's.

Layout of a cluster dir (default ``<cache>/cluster-<port>``)::

    cluster.json    name, CQL port, storage port, version, heap, and each node's address,
                    dir and token (written by the first start; later starts reuse it)
    node1/ ...      node dirs of cassandra_node.py (node.json, conf/, data/, logs/)

The nodes listen on 127.0.0.1, 127.0.0.2, ... (the loopback range: nothing leaves the
machine), all on the same CQL and storage ports, in one data center (``SimpleSnitch``:
``datacenter1``). Node 1 is the seed. Each node has one token, evenly spaced over the
Murmur3 ring (node ``i`` of ``n`` owns the ``i``-th ``n``-th of it), and joins without
bootstrapping: a new cluster holds no data to stream.

A start launches the nodes one after the other, each once the one before answers CQL (a
node joining while another is still starting can miss its gossip), then waits until every
node lists every other one as a peer with its own schema version (the cluster agrees on the
schema): only then can a keyspace with replication factor 3 be created and used at once.
A start of a cluster whose dir exists starts only the nodes that are not running (after a
``kill`` or a ``stop``) and waits for agreement again: that is how a test brings a killed node
back with its data.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ipaddress
import json
import os
import shutil
import signal
import struct
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

SCRIPTS_DIR = Path(__file__).resolve().parent
if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))

import cassandra_node as cn  # noqa: E402
import local_server  # noqa: E402
from local_server import log  # noqa: E402

DEFAULT_NODES = 3
MAX_NODES = 9
DEFAULT_PORT = 9042
# A node of 512 MB died under the tests' RF 3 writes (after "Coordinator node overloaded");
# three of 1 GB, Spark and the tests fit a 24 GB machine.
DEFAULT_HEAP = cn.DEFAULT_HEAP
STATE_FILE = "cluster.json"
MIN_TOKEN = -(2 ** 63)


class ClusterError(cn.CassandraNodeError):
    """A cluster start/stop failure with a message meant for humans."""


def host_of(index: int) -> str:
    """The loopback address of node ``index`` (1-based): 127.0.0.<index>."""
    return f"127.0.0.{index}"


def token_of(index: int, nodes: int) -> str:
    """Node ``index`` of ``nodes``'s token: the ring cut in ``nodes`` equal ranges."""
    return str(MIN_TOKEN + (index - 1) * (2 ** 64 // nodes))


@dataclass
class ClusterNode:
    index: int
    host: str
    node_dir: str
    initial_token: str


@dataclass
class ClusterInfo:
    cluster_dir: str
    name: str
    port: int
    storage_port: int
    version: str = cn.CASSANDRA_VERSION
    heap: str = DEFAULT_HEAP
    fast: bool = False
    nodes: List[ClusterNode] = field(default_factory=list)

    @property
    def hosts(self) -> List[str]:
        return [n.host for n in self.nodes]

    @property
    def contact_points(self) -> str:
        """What ``spark.cassandra.connection.host`` takes: the nodes' addresses."""
        return ",".join(self.hosts)

    def membership(self, node: ClusterNode) -> dict:
        return {"cluster_name": self.name, "initial_token": node.initial_token,
                "seeds": f"{self.nodes[0].host}:{self.storage_port}"}

    def node(self, index: int) -> ClusterNode:
        for n in self.nodes:
            if n.index == index:
                return n
        raise ClusterError(f"the cluster in {self.cluster_dir} has no node {index} "
                           f"(nodes 1..{len(self.nodes)})")

    def save(self) -> None:
        path = Path(self.cluster_dir) / STATE_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)


def default_dir(port: int) -> Path:
    return cn.CACHE.root() / f"cluster-{port}"


def load(cluster_dir: os.PathLike) -> Optional[ClusterInfo]:
    try:
        data = json.loads((Path(cluster_dir) / STATE_FILE).read_text())
        data["nodes"] = [ClusterNode(**n) for n in data["nodes"]]
        return ClusterInfo(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def resolve(port: Optional[int], cluster_dir: Optional[os.PathLike]) -> tuple[Optional[int], Path]:
    """(port, cluster dir): without a dir, the port's default dir, and the port
    :data:`DEFAULT_PORT` if none is given (so that ``stop --port P`` finds what ``start --port
    P`` made); with a dir, the port as given (None: the recorded one, or free ones)."""
    if cluster_dir is None:
        port = port or DEFAULT_PORT
        return port, default_dir(port)
    return port, Path(cluster_dir).expanduser().resolve()


def _in_use(port: int, host: str) -> bool:
    try:
        return local_server.port_in_use(port, host, wildcard=False)
    except OSError as e:   # EADDRNOTAVAIL: not an address of this machine
        raise ClusterError(
            f"cannot use {host}: {e.strerror}. On Linux the whole 127.0.0.0/8 range is "
            f"local; elsewhere add the address to the loopback interface first (e.g. "
            f"`sudo ifconfig lo0 alias {host}` on macOS)") from None


def free_ports(hosts: List[str], port: Optional[int] = None) -> tuple[int, int]:
    """A CQL port (``port`` if given, once checked) and a storage port free on every one of
    ``hosts``."""
    if port is not None:
        busy = [h for h in hosts if _in_use(port, h)]
        if busy:
            raise ClusterError(f"port {port} is in use on {', '.join(busy)}")
    for _ in range(100):
        cql = port or local_server.free_port()
        storage = local_server.free_port(exclude=(cql,))
        if not any(_in_use(p, h) for h in hosts for p in (cql, storage)):
            return cql, storage
    raise ClusterError(f"found no pair of ports free on all of {', '.join(hosts)}")


def _node_info(info: ClusterInfo, node: ClusterNode) -> cn.NodeInfo:
    return cn.NodeInfo(node_dir=node.node_dir, port=info.port, storage_port=info.storage_port,
                       host=node.host, membership=info.membership(node))


def node_pid(node: ClusterNode) -> Optional[int]:
    return cn.KIND.running_pid(Path(node.node_dir))


# --------------------------------------------------------------------------------------------
# agreement


def _view(info: ClusterInfo, node: ClusterNode, timeout: float = 3.0) -> Optional[dict]:
    """What ``node`` knows of the cluster: {address: (gossip generation or None, ready for
    CQL, schema version)}, itself included; None if it does not answer.

    From ``system_views.gossip_info`` where the node has it (5.0): a peer that restarted has a
    new generation, and a node that shows it has heard from the restarted peer since (and
    marked it up). Else (4.1) from ``system.local`` and ``system.peers``, which keep a dead
    peer listed: generations are then None."""
    rows = cn.cql_rows(info.port, node.host, "SELECT address, generation, rpc_ready, \"schema\" "
                       "FROM system_views.gossip_info", timeout)
    if rows:
        return {str(ipaddress.ip_address(a)): (
                    struct.unpack(">i", g)[0] if g else None, r == b"true",
                    v.decode() if v else None) for a, g, r, v in rows if a}
    local = cn.cql_rows(info.port, node.host, "SELECT schema_version FROM system.local", timeout)
    peers = cn.cql_rows(info.port, node.host, "SELECT peer, schema_version FROM system.peers",
                        timeout)
    if not local or peers is None:
        return None

    def as_uuid(b: Optional[bytes]) -> Optional[str]:
        return str(uuid.UUID(bytes=b)) if b else None
    view = {str(ipaddress.ip_address(p)): (None, True, as_uuid(v)) for p, v in peers if p}
    view[node.host] = (None, True, as_uuid(local[0][0]))
    return view


def disagreement(info: ClusterInfo, running: List[ClusterNode]) -> Optional[str]:
    """Why the running nodes are not one cluster yet: one does not answer CQL, one does not
    know another, or knows it from before its last restart (an older generation), or not yet
    ready for clients, or they have two schema versions; None once they are one."""
    views = {}
    for node in running:
        views[node.host] = _view(info, node)
        if views[node.host] is None:
            return f"node {node.index} ({node.host}) does not answer CQL"
    own = {host: view.get(host, (None, True, None)) for host, view in views.items()}
    for node in running:
        view = views[node.host]
        for other in running:
            if other is node:
                continue
            seen = view.get(other.host)
            if seen is None:
                return f"node {node.index} ({node.host}) does not know {other.host} yet"
            if seen[0] != own[other.host][0] or not seen[1]:
                return (f"node {node.index} ({node.host}) has not seen {other.host} up since "
                        f"its last start yet")
    schemas = {host: own[host][2] for host in views}
    if len(set(schemas.values())) > 1:
        return "the nodes do not agree on the schema yet: " + ", ".join(
            f"{h} {v}" for h, v in schemas.items())
    return None


def wait_agreement(info: ClusterInfo, running: List[ClusterNode], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        why = disagreement(info, running)
        if why is None:
            return
        if time.monotonic() >= deadline:
            raise ClusterError(f"the cluster in {info.cluster_dir} did not come together "
                               f"within {timeout:.0f}s: {why}")
        time.sleep(1.0)


# --------------------------------------------------------------------------------------------
# start / stop / kill / status


def start(nodes: Optional[int] = None, port: Optional[int] = None,
          cluster_dir: Optional[os.PathLike] = None, *, heap: Optional[str] = None,
          fast: bool = False, version: Optional[str] = None,
          timeout: float = cn.DEFAULT_TIMEOUT, die_with_parent: bool = False,
          quiet: bool = False) -> ClusterInfo:
    """Start the cluster of ``cluster_dir`` (made with ``nodes`` nodes, default
    :data:`DEFAULT_NODES`, on its first start; later starts start the nodes that are not
    running, with the recorded heap, version and ``fast``) and wait until its running nodes
    agree. ``timeout``: for each node to answer CQL, and then for the agreement."""
    say = (lambda m: None) if quiet else log
    port, cluster_dir = resolve(port, cluster_dir)
    info = load(cluster_dir) if cluster_dir.exists() else None
    if info is None:
        nodes = DEFAULT_NODES if nodes is None else nodes
        if not 1 <= nodes <= MAX_NODES:
            raise ClusterError(f"--nodes must be 1..{MAX_NODES}, not {nodes}")
        hosts = [host_of(i) for i in range(1, nodes + 1)]
        port, storage_port = free_ports(hosts, port)
        cluster_dir.mkdir(parents=True, exist_ok=True)
        info = ClusterInfo(
            cluster_dir=str(cluster_dir), name=f"cassandra-wal-cluster-{port}", port=port,
            storage_port=storage_port, version=version or cn.CASSANDRA_VERSION,
            heap=heap or os.environ.get("CASSANDRA_WAL_HEAP") or DEFAULT_HEAP, fast=fast,
            nodes=[ClusterNode(i, hosts[i - 1], str(cluster_dir / f"node{i}"),
                               token_of(i, nodes)) for i in range(1, nodes + 1)])
        info.save()
    elif port is not None and port != info.port:
        raise ClusterError(f"the cluster in {cluster_dir} runs on port {info.port}, not {port}")
    elif nodes is not None and nodes != len(info.nodes):
        raise ClusterError(f"the cluster in {cluster_dir} has {len(info.nodes)} nodes, not "
                           f"{nodes}; `stop --purge` it to make another")
    t0 = time.monotonic()
    for node in info.nodes:
        _start_node(info, node, timeout, die_with_parent, say)
    wait_agreement(info, info.nodes, timeout)
    say(f"cluster {info.name}: {len(info.nodes)} nodes up on {info.contact_points} "
        f"port {info.port}, agreeing on the schema, after {time.monotonic() - t0:.1f}s")
    return info


#: What a node says when its gossip shadow round at start got no usable answer from the
#: seeds: seen once here when a node killed with ``kill -9`` came back within seconds on a
#: loaded machine (the seed still held its old state). The same start a few seconds later
#: joins; the node's data is untouched either way.
SHADOW_ROUND_FAILED = "Unable to gossip with any peers"
START_ATTEMPTS = 3
START_RETRY_AFTER_S = 5.0


def _start_node(info: ClusterInfo, node: ClusterNode, timeout: float, die_with_parent: bool,
                say, sleep=time.sleep) -> None:
    """Start ``node`` unless it runs, and wait until it answers CQL; a start whose gossip
    shadow round failed (:data:`SHADOW_ROUND_FAILED`) is tried again, up to
    :data:`START_ATTEMPTS` times."""
    if node_pid(node):
        return
    for attempt in range(1, START_ATTEMPTS + 1):
        say(f"starting node {node.index} of {len(info.nodes)} on {node.host}:{info.port} ...")
        try:
            cn.start(info.port, node.node_dir, timeout=timeout, fast=info.fast, heap=info.heap,
                     die_with_parent=die_with_parent, quiet=True, version=info.version,
                     host=node.host, storage_port=info.storage_port,
                     membership=info.membership(node))
            return
        except cn.CassandraNodeError as exc:
            if SHADOW_ROUND_FAILED not in str(exc) or attempt == START_ATTEMPTS:
                raise
            say(f"node {node.index}: {SHADOW_ROUND_FAILED} (gossip shadow round); starting it "
                f"again in {START_RETRY_AFTER_S:.0f}s")
            sleep(START_RETRY_AFTER_S)


def start_node(index: int, port: Optional[int] = None,
               cluster_dir: Optional[os.PathLike] = None, *,
               timeout: float = cn.DEFAULT_TIMEOUT, die_with_parent: bool = False,
               quiet: bool = False) -> ClusterInfo:
    """Start node ``index`` alone (the others as they are) and wait until it and the other
    running nodes agree: how a test brings back one of two nodes it took down."""
    say = (lambda m: None) if quiet else log
    info = _existing(port, cluster_dir)
    node = info.node(index)
    _start_node(info, node, timeout, die_with_parent, say)
    wait_agreement(info, [n for n in info.nodes if node_pid(n)], timeout)
    return info


def kill(index: int, port: Optional[int] = None,
         cluster_dir: Optional[os.PathLike] = None) -> Optional[int]:
    """``kill -9`` node ``index`` (its data stays; ``start`` brings it back); its pid."""
    info = _existing(port, cluster_dir)
    node = info.node(index)
    pid = node_pid(node)
    if pid:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while cn.KIND.is_ours(pid, Path(node.node_dir)):
            if time.monotonic() >= deadline:
                raise ClusterError(f"node {index} (pid {pid}) is still alive 10 s after SIGKILL")
            time.sleep(0.05)
    return pid


def stop_node(index: int, port: Optional[int] = None,
              cluster_dir: Optional[os.PathLike] = None) -> Optional[int]:
    """Stop node ``index`` (SIGTERM, then SIGKILL); its data stays."""
    info = _existing(port, cluster_dir)
    return cn.stop(None, info.node(index).node_dir)


def stop(port: Optional[int] = None, cluster_dir: Optional[os.PathLike] = None, *,
         purge: bool = False, timeout: float = cn.STOP_TIMEOUT) -> List[int]:
    """Stop every node; ``purge``: delete the cluster dir too. The pids stopped."""
    _, cluster_dir = resolve(port, cluster_dir)
    info = load(cluster_dir) if cluster_dir.exists() else None
    stopped = []
    if info is not None:   # all at once: each waits for its JVM to go
        with concurrent.futures.ThreadPoolExecutor(len(info.nodes)) as pool:
            pids = pool.map(lambda n: cn.stop(None, n.node_dir, purge=purge, timeout=timeout),
                            info.nodes)
        stopped = [pid for pid in pids if pid]
    if purge and cluster_dir.exists():
        (cluster_dir / STATE_FILE).unlink(missing_ok=True)
        (cluster_dir / (STATE_FILE + ".tmp")).unlink(missing_ok=True)
        shutil.rmtree(cluster_dir, ignore_errors=True)
    return stopped


def _existing(port: Optional[int], cluster_dir: Optional[os.PathLike]) -> ClusterInfo:
    _, cluster_dir = resolve(port, cluster_dir)
    info = load(cluster_dir) if cluster_dir.exists() else None
    if info is None:
        raise ClusterError(f"no cluster in {cluster_dir} (start one with "
                           f"`scripts/cassandra cluster start --dir {cluster_dir}`)")
    return info


def status(port: Optional[int] = None, cluster_dir: Optional[os.PathLike] = None) -> dict:
    """{'state': 'up'|'degraded'|'down', 'nodes': [{index, host, state, pid, ...}], ...}:
    up when every node answers and they agree, degraded when some do, down when none does."""
    _, cluster_dir = resolve(port, cluster_dir)
    info = load(cluster_dir) if cluster_dir.exists() else None
    if info is None:
        return {"state": "down", "cluster_dir": str(cluster_dir), "nodes": [],
                "note": "no cluster recorded there"}
    nodes, answering = [], []
    for node in info.nodes:
        pid = node_pid(node)
        version = _node_info(info, node).probe() if pid else None
        state = "up" if version is not None else ("starting" if pid else "down")
        if state == "up":
            answering.append(node)
        nodes.append({"index": node.index, "host": node.host, "state": state, "pid": pid,
                      "release_version": version, "token": node.initial_token,
                      "node_dir": node.node_dir})
    why = disagreement(info, answering) if answering else None
    state = ("up" if len(answering) == len(info.nodes) and why is None
             else "degraded" if answering else "down")
    result = {"state": state, "name": info.name, "contact_points": info.contact_points,
              "port": info.port, "storage_port": info.storage_port, "version": info.version,
              "cluster_dir": str(cluster_dir), "nodes": nodes}
    if why:
        result["note"] = why
    return result


# --------------------------------------------------------------------------------------------
# command line (scripts/cassandra cluster ...)


EPILOG = """\
examples:
  scripts/cassandra cluster start                   # 3 nodes on 127.0.0.1-3, port 9042
  scripts/cassandra cluster start --nodes 3 --port 19042 --dir /tmp/c3 --heap 1g
  scripts/cassandra cluster status --dir /tmp/c3 --json
  scripts/cassandra cluster kill --node 2 --dir /tmp/c3      # kill -9 node 2 (data kept)
  scripts/cassandra cluster start-node --node 2 --dir /tmp/c3 # bring it back (start: all down)
  scripts/cassandra cluster stop --dir /tmp/c3 --purge       # stop all, delete the data

stdout of `start` is exactly HOSTS:PORT, e.g. 127.0.0.1,127.0.0.2,127.0.0.3:19042 (what
spark.cassandra.connection.host and .port take); progress and errors go to stderr.
exit codes: 0 ok / up; 1 failure / down or degraded.
Three nodes start in 23-30 s here (2 cores), 56 s with the machine busy.
"""


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", dest="cluster_dir", default=None,
                        help="cluster directory (default: <cache>/cluster-<port>)")
    common.add_argument("--port", type=int, default=None,
                        help=f"CQL port of every node (default: {DEFAULT_PORT} without --dir; "
                             f"with --dir a free one on the first start, then the recorded one)")
    common.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="cassandra cluster", formatter_class=fmt, epilog=EPILOG,
        description="Run a local Cassandra cluster: nodes on 127.0.0.1, 127.0.0.2, ... (one "
                    "data center, node 1 the seed, evenly spaced tokens).")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", parents=[common], formatter_class=fmt, epilog=EPILOG,
                       help="start the cluster (or its nodes that are down) and wait until "
                            "they agree")
    s.add_argument("--nodes", type=int, default=None,
                   help=f"number of nodes of a new cluster (default {DEFAULT_NODES})")
    s.add_argument("--heap", default=None, help=f"JVM heap of each node (default {DEFAULT_HEAP})")
    s.add_argument("--version", default=None, help=f"Cassandra version: {', '.join(cn.RELEASES)}")
    s.add_argument("--fast", action="store_true",
                   help="tests only: -Dcassandra.unsafesystem=true (system tables not fsynced)")
    s.add_argument("--timeout", type=float, default=cn.DEFAULT_TIMEOUT,
                   help=f"seconds for each node to answer CQL (default {cn.DEFAULT_TIMEOUT:.0f})")
    t = sub.add_parser("stop", parents=[common], formatter_class=fmt, epilog=EPILOG,
                       help="stop every node")
    t.add_argument("--purge", action="store_true", help="also delete the cluster's data")
    for name, what in (("kill", "kill -9 one node (its data stays)"),
                       ("stop-node", "stop one node (SIGTERM; its data stays)"),
                       ("start-node", "start one node that is down, and wait until the "
                                      "running nodes agree")):
        k = sub.add_parser(name, parents=[common], formatter_class=fmt, epilog=EPILOG, help=what)
        k.add_argument("--node", type=int, required=True, help="the node's number (1..n)")
    sub.add_parser("status", parents=[common], formatter_class=fmt, epilog=EPILOG,
                   help="is every node up and agreeing? (exit 0 up, 1 not)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "start":
            info = start(args.nodes, args.port, args.cluster_dir, heap=args.heap,
                         fast=args.fast, version=args.version, timeout=args.timeout)
            return local_server.answer(args, {"contact_points": info.contact_points,
                                              **asdict(info)},
                                       f"{info.contact_points}:{info.port}")
        if args.command == "stop":
            pids = stop(args.port, args.cluster_dir, purge=args.purge)
            return local_server.answer(args, {"stopped_pids": pids, "purged": args.purge},
                                       f"stopped {len(pids)} node(s)")
        if args.command == "start-node":
            info = start_node(args.node, args.port, args.cluster_dir)
            return local_server.answer(args, {"node": args.node, "contact_points":
                                              info.contact_points, "port": info.port},
                                       f"node {args.node} up")
        if args.command in ("kill", "stop-node"):
            act = kill if args.command == "kill" else stop_node
            pid = act(args.node, args.port, args.cluster_dir)
            return local_server.answer(args, {"node": args.node, "pid": pid},
                                       f"node {args.node}: " + (f"pid {pid} gone" if pid
                                                                else "was not running"))
        st = status(args.port, args.cluster_dir)
        if args.json:
            print(json.dumps(st))
        else:
            print(f"{st['state']}: " + ", ".join(
                f"node {n['index']} {n['host']} {n['state']}" for n in st["nodes"])
                + (f" ({st['note']})" if st.get("note") else ""))
        return 0 if st["state"] == "up" else 1
    except local_server.ServerError as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
