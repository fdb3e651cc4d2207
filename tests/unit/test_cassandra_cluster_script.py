"""scripts/cassandra cluster without starting a node: tokens, each node's cassandra.yaml, ports
shared over loopback addresses, the raw CQL result parser its agreement check reads peers with,
and its command line."""

from __future__ import annotations

import socket
import struct
import uuid

import pytest

from tests.helpers.node import load_script_module

pytestmark = pytest.mark.unit

cn = load_script_module("cassandra_node")
cc = load_script_module("cassandra_cluster")
local_server = load_script_module("local_server")


def test_tokens_cut_the_ring_in_equal_ranges():
    tokens = [int(cc.token_of(i, 3)) for i in (1, 2, 3)]
    assert tokens == [-2 ** 63, -2 ** 63 + 2 ** 64 // 3, -2 ** 63 + 2 * (2 ** 64 // 3)]
    assert all(-2 ** 63 <= t < 2 ** 63 for t in tokens)
    assert [cc.host_of(i) for i in (1, 2, 3)] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def test_a_cluster_node_gets_its_address_the_seed_its_token_and_no_bootstrap(tmp_path):
    info = cc.ClusterInfo(cluster_dir=str(tmp_path), name="cassandra-wal-cluster-19042",
                          port=19042, storage_port=17000,
                          nodes=[cc.ClusterNode(i, cc.host_of(i), str(tmp_path / f"node{i}"),
                                                cc.token_of(i, 3)) for i in (1, 2, 3)])
    yaml = cn.render_cassandra_yaml(cc._node_info(info, info.node(2)))
    assert "cluster_name: 'cassandra-wal-cluster-19042'" in yaml
    assert 'seeds: "127.0.0.1:17000"' in yaml
    assert "listen_address: 127.0.0.2\nrpc_address: 127.0.0.2\n" in yaml
    assert f"initial_token: {cc.token_of(2, 3)}\nauto_bootstrap: false\n" in yaml
    assert "storage_port: 17000\nnative_transport_port: 19042\n" in yaml


def test_a_single_node_is_its_own_seed_on_127_0_0_1(tmp_path):
    yaml = cn.render_cassandra_yaml(cn.NodeInfo(str(tmp_path), 19042, storage_port=17000))
    assert "cluster_name: 'cassandra-wal-19042'" in yaml
    assert 'seeds: "127.0.0.1:17000"' in yaml
    assert "listen_address: 127.0.0.1\n" in yaml
    assert "initial_token" not in yaml and "auto_bootstrap" not in yaml


def test_a_port_held_on_one_loopback_address_is_free_on_another():
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        port = held.getsockname()[1]
        assert local_server.port_in_use(port, "127.0.0.2", wildcard=False)
        assert not local_server.port_in_use(port, "127.0.0.3", wildcard=False)
        # A single node on 127.0.0.1 also wants the wildcard free: it is not, here.
        assert local_server.port_in_use(port, "127.0.0.1")


def _string(s: str) -> bytes:
    return struct.pack(">H", len(s)) + s.encode()


def _rows_body(columns: list[tuple[str, int]], rows: list[list[bytes | None]]) -> bytes:
    body = struct.pack(">iii", 2, 0x0001, len(columns)) + _string("system") + _string("peers")
    for name, type_id in columns:
        body += _string(name) + struct.pack(">H", type_id)
    body += struct.pack(">i", len(rows))
    for row in rows:
        for cell in row:
            body += struct.pack(">i", -1) if cell is None else struct.pack(">i", len(cell)) + cell
    return body


def test_rows_of_a_result_are_read_cell_by_cell_nulls_included():
    version = uuid.uuid4()
    body = _rows_body([("peer", 0x0010), ("schema_version", 0x000C)],
                      [[socket.inet_aton("127.0.0.2"), version.bytes],
                       [socket.inet_aton("127.0.0.3"), None]])
    assert cn._rows(body) == [[socket.inet_aton("127.0.0.2"), version.bytes],
                              [socket.inet_aton("127.0.0.3"), None]]


def test_a_result_with_a_collection_column_is_not_guessed_at():
    assert cn._rows(_rows_body([("tokens", 0x0022)], [])) is None   # set<...> has parameters
    assert cn._rows(struct.pack(">i", 1)) is None                     # Void, not Rows


def test_the_command_line_has_examples_and_refuses_a_bad_node_count(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cc.main(["start", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "cluster kill --node 2" in out
    assert cc.main(["start", "--nodes", "12", "--dir", str(tmp_path / "c")]) == 1
    assert "--nodes must be 1..9" in capsys.readouterr().err


def test_kill_of_a_cluster_that_does_not_exist_says_how_to_start_one(tmp_path, capsys):
    assert cc.main(["kill", "--node", "2", "--dir", str(tmp_path / "none")]) == 1
    assert "scripts/cassandra cluster start --dir" in capsys.readouterr().err


def _three(tmp_path):
    return cc.ClusterInfo(cluster_dir=str(tmp_path), name="c", port=19042, storage_port=17000,
                          nodes=[cc.ClusterNode(i, cc.host_of(i), str(tmp_path / f"node{i}"),
                                                cc.token_of(i, 3)) for i in (1, 2, 3)])


def test_agreement_waits_until_every_node_saw_a_restarted_one_up(tmp_path, monkeypatch):
    info = _three(tmp_path)
    own = {"127.0.0.1": 100, "127.0.0.2": 250, "127.0.0.3": 120}   # node 2 restarted: 250
    seen_by_1 = {"127.0.0.2": 200}   # node 1 still knows node 2 from before its restart
    schema = "s1"

    def view(_info, node):
        return {h: (seen_by_1.get(h, g) if node.host == "127.0.0.1" else g, True, schema)
                for h, g in own.items()}
    monkeypatch.setattr(cc, "_view", view)
    assert cc.disagreement(info, info.nodes) == (
        "node 1 (127.0.0.1) has not seen 127.0.0.2 up since its last start yet")
    seen_by_1.clear()
    assert cc.disagreement(info, info.nodes) is None
    # Only the running nodes are asked: node 3 down does not hold the others back.
    assert cc.disagreement(info, info.nodes[:2]) is None


def test_agreement_waits_for_one_schema_and_for_every_node_to_answer(tmp_path, monkeypatch):
    info = _three(tmp_path)
    monkeypatch.setattr(cc, "_view", lambda _i, node: {
        h: (1, True, "s2" if h == "127.0.0.3" else "s1") for h in info.hosts})
    assert cc.disagreement(info, info.nodes).startswith("the nodes do not agree on the schema")
    monkeypatch.setattr(cc, "_view", lambda _i, node: {})
    assert cc.disagreement(info, info.nodes) == "node 1 (127.0.0.1) does not know 127.0.0.2 yet"
    monkeypatch.setattr(cc, "_view", lambda _i, node: None if node.index == 2 else {})
    assert cc.disagreement(info, info.nodes) == "node 2 (127.0.0.2) does not answer CQL"


def test_without_a_dir_the_port_names_the_dir_so_stop_finds_what_start_made():
    port, where = cc.resolve(None, None)
    assert (port, where.name) == (cc.DEFAULT_PORT, f"cluster-{cc.DEFAULT_PORT}")
    assert cc.resolve(19042, None)[1].name == "cluster-19042"


def test_a_given_port_in_use_on_one_node_address_is_refused_before_anything_is_made():
    with socket.socket() as held:
        held.bind(("127.0.0.3", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(cc.ClusterError, match=f"port {port} is in use on 127.0.0.3"):
            cc.free_ports(["127.0.0.1", "127.0.0.2", "127.0.0.3"], port)


def test_a_node_whose_gossip_shadow_round_failed_is_started_again(tmp_path, monkeypatch):
    """Seen in the suite: node 2, killed with kill -9 and started again at once on a loaded
    machine, exited with 'Unable to gossip with any peers' (its shadow round); the test failed
    although the same start seconds later joins. Other start failures are not retried."""
    info = _three(tmp_path)
    monkeypatch.setattr(cc, "node_pid", lambda node: None)
    calls, slept = [], []
    failures = [cc.cn.CassandraNodeError("node2 exited with code 3\njava.lang.RuntimeException: "
                                         "Unable to gossip with any peers")]

    def start(*args, **kwargs):
        calls.append(kwargs["host"])
        if failures:
            raise failures.pop()
    monkeypatch.setattr(cc.cn, "start", start)
    cc._start_node(info, info.node(2), 60, False, lambda m: None, sleep=slept.append)
    assert calls == ["127.0.0.2", "127.0.0.2"] and slept == [cc.START_RETRY_AFTER_S]

    failures[:] = [cc.cn.CassandraNodeError("port 19042 in use")]
    with pytest.raises(cc.cn.CassandraNodeError, match="in use"):
        cc._start_node(info, info.node(2), 60, False, lambda m: None, sleep=slept.append)
    failures[:] = [cc.cn.CassandraNodeError(cc.SHADOW_ROUND_FAILED)] * cc.START_ATTEMPTS
    with pytest.raises(cc.cn.CassandraNodeError, match="gossip"):
        cc._start_node(info, info.node(2), 60, False, lambda m: None, sleep=slept.append)


def test_extra_jvm_options_go_on_the_nodes_command_line_before_the_class_path(tmp_path):
    info = cn.NodeInfo(str(tmp_path), 19042, storage_port=17000,
                       jvm_extra_opts=["-XX:TieredStopAtLevel=1", "-Dx=y"])
    cmd = cn.java_command(info, tmp_path / "jdk", tmp_path / "lib")
    assert cmd.index("-XX:TieredStopAtLevel=1") < cmd.index("-Dx=y") < cmd.index("-cp")
    plain = cn.java_command(cn.NodeInfo(str(tmp_path), 19042), tmp_path / "jdk", tmp_path / "lib")
    assert not any(a.startswith("-XX:TieredStopAtLevel") for a in plain)
