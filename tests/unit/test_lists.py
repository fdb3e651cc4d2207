"""Non-frozen list columns (issue 30, item 1).

Cassandra keeps each element of a non-frozen list in a cell of its own, named by a time-based
id the node picks at each write: ``INSERT ... l = ['a', 'b'] USING TIMESTAMP 1000`` run twice
leaves ``['a', 'b', 'a', 'b']`` (measured on 5.0.8; CASSANDRA-11368). This sink writes a row
again on purpose (the driver's retry after a timeout, a replay after a crash, a flush task run
again), so such a column is refused before anything is staged unless the user accepts
at-least-once for it (``wal.lists.atLeastOnce``). Sets, maps and frozen collections are
idempotent (a set's or map's cell is named by its element or key; a frozen collection is one
cell), and so is a non-frozen UDT (a cell per field, and Cassandra refuses a non-frozen
collection inside it). The opt-in is recorded in each batch's seal.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from pyspark.sql import types as T

from cql.config import WriteConfig
from cql.errors import OptionError, SchemaError
from cql.table import TableSchema
from recovery.config import SinkConfig
from recovery.target import RecordedTarget, Target
from sinks import plan
from sinks.options import parse_options
from sinks.validation import validate_schema
from wal.layout import WalDir
from wal.seal import Seal, decode_seal, encode_seal

pytestmark = pytest.mark.unit

OPTION = "wal.lists.atLeastOnce"
WITH_LIST = ("withlist", (("name", "text"), ("l", "list<text>")))          # as the driver reports it
WITH_FROZEN_LIST = ("withflist", (("name", "text"), ("l", "frozen<list<text>>")))
TABLE = TableSchema(
    "ks", "t",
    (("k", "int"), ("l", "list<text>"), ("fl", "frozen<list<text>>"), ("st", "set<text>"),
     ("m", "map<text, int>"), ("ml", "map<text, frozen<list<int>>>"),
     ("tl", "frozen<tuple<int, list<text>>>"), ("u", "frozen<withlist>"), ("nu", "withflist"),
     ("v", "text"), ("other", "list<int>")),
    ("k",), user_types=(WITH_LIST, WITH_FROZEN_LIST))
TEXTS = T.ArrayType(T.StringType())
UDT = T.StructType([T.StructField("name", T.StringType()), T.StructField("l", TEXTS)])
SPARK = {"k": T.IntegerType(), "l": TEXTS, "fl": TEXTS, "st": TEXTS,
         "m": T.MapType(T.StringType(), T.IntegerType()),
         "ml": T.MapType(T.StringType(), T.ArrayType(T.IntegerType())),
         "tl": T.StructType([T.StructField("_1", T.IntegerType()), T.StructField("_2", TEXTS)]),
         "u": UDT, "nu": UDT, "v": T.StringType(), "other": T.ArrayType(T.IntegerType())}


def df(*names: str) -> T.StructType:
    return T.StructType([T.StructField(n, SPARK[n.lower()]) for n in ("k",) + names])


def opted(*columns: str) -> WriteConfig:
    return WriteConfig(lists_at_least_once=columns)


# -- validation ---------------------------------------------------------------------------------

def test_a_non_frozen_list_column_is_refused_naming_the_remedies():
    with pytest.raises(SchemaError) as info:
        validate_schema(df("v", "l"), TABLE, WriteConfig())
    assert info.value.column == "l"
    reason = info.value.reason
    for remedy in ("frozen<list<text>>", "set<text>", f"{OPTION}=l"):
        assert remedy in reason, reason
    assert "list<text>" in reason and "replay" in reason


@pytest.mark.parametrize("column", ["fl", "st", "m", "ml", "tl", "u", "nu"], ids=[
    "frozen-list", "set", "map", "frozen-lists-in-a-map", "list-in-a-tuple",
    "list-in-a-frozen-udt", "frozen-list-in-a-non-frozen-udt"])
def test_frozen_lists_sets_maps_and_lists_inside_frozen_types_are_accepted(column):
    assert validate_schema(df(column), TABLE, WriteConfig()) == ["k", column]


def test_the_opt_in_lets_the_named_list_columns_through_and_no_other():
    assert validate_schema(df("l", "v"), TABLE, opted("l")) == ["k", "l", "v"]
    assert validate_schema(df("L"), TABLE, opted("l")) == ["k", "L"]       # the table's name
    assert validate_schema(df("l"), TABLE, opted("L")) == ["k", "l"]       # matched as columns are
    with pytest.raises(SchemaError) as info:
        validate_schema(df("l", "other"), TABLE, opted("l"))
    assert info.value.column == "other" and f"{OPTION}=l,other" in info.value.reason


def test_a_list_column_the_dataframe_does_not_write_is_not_refused():
    assert validate_schema(df("v"), TABLE, WriteConfig()) == ["k", "v"]
    assert validate_schema(df("v"), TABLE, opted("l", "other")) == ["k", "v"]


@pytest.mark.parametrize("named, why", [
    ("v", "text, not a non-frozen list"),
    ("fl", "frozen<list<text>>, not a non-frozen list"),
    ("st", "set<text>, not a non-frozen list"),
    ("nope", "not a column of ks.t"),
])
def test_the_opt_in_naming_anything_but_a_non_frozen_list_column_is_refused(named, why):
    with pytest.raises(OptionError) as info:
        validate_schema(df("l"), TABLE, opted("l", named))
    assert info.value.option == OPTION and named in str(info.value), str(info.value)
    assert why in info.value.reason, info.value.reason


def test_the_option_is_comma_separated_column_names():
    base = {"keyspace": "ks", "table": "t"}
    assert parse_options(base).write.lists_at_least_once == ()
    assert parse_options({**base, OPTION.lower(): " l , Other,l "}).write.lists_at_least_once \
        == ("l", "Other")
    assert parse_options({**base, OPTION: "l,,other,"}).write.lists_at_least_once == ("l", "other")
    for bad in ("", " , "):
        with pytest.raises(OptionError) as info:
            parse_options({**base, OPTION: bad})
        assert info.value.option == OPTION


# -- the seal records it ------------------------------------------------------------------------

def target(*opted_in: str, columns=("k", "l")) -> Target:
    return Target(SinkConfig("ks", "t", write=opted(*opted_in)), TABLE, columns)


def test_the_seal_records_the_opt_in_and_a_replay_writes_as_sealed():
    record = target("l").write_record()
    assert record["lists_at_least_once"] == ("l",)
    seal = decode_seal(encode_seal(Seal(3, (), 1, write=record)), "s")   # through JSON
    restarted = target()                                                  # the option dropped
    assert restarted.as_sealed(seal.write).config.write.lists_at_least_once == ("l",)
    assert target("l").as_sealed(target().write_record()).config.write == WriteConfig()


def test_a_seal_written_before_the_option_existed_opts_nothing_in():
    earlier = {k: v for k, v in target().write_record().items() if k != "lists_at_least_once"}
    assert target("l").as_sealed(earlier).config.write.lists_at_least_once == ()


def test_a_query_upgraded_with_a_list_column_is_refused_at_its_next_batch(tmp_path, monkeypatch):
    """The release before this one let the list through and recorded the query's target with
    the fingerprint of its options, which knew no opt-in. The fingerprint of the same options
    differs now, so the next batch validates the DataFrame again, and is refused."""
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    options = {"keyspace": "ks", "table": "t", "checkpointLocation": str(cp)}
    config = parse_options(options)
    earlier = config.public_dict()
    earlier["write"].pop("lists_at_least_once", None)
    earlier_config = SimpleNamespace(public_dict=lambda: earlier)
    recorded = Target(config, TABLE, ("k", "l")).to_dict()
    recorded["config"]["write"].pop("lists_at_least_once", None)
    wal = WalDir(str(cp / plan.DEFAULT_STREAM_WAL)).create()
    RecordedTarget(recorded, plan._fingerprint(earlier_config, df("l").json()),
                   str(cp)).write(wal)
    assert RecordedTarget.read(wal).target.config.write.lists_at_least_once == ()

    looked_up = []
    cluster = SimpleNamespace(shutdown=lambda: None)
    monkeypatch.setattr(plan, "connect", lambda connection: (cluster, None))
    monkeypatch.setattr(plan, "fetch_table_schema",
                        lambda c, ks, t: looked_up.append(t) or TABLE)
    with pytest.raises(SchemaError) as info:
        plan.prepare_write(options, {}, df("l"), streaming=True)
    assert info.value.column == "l" and looked_up == ["t"]
    assert wal.staged_batch_ids() == [] and wal.sealed_batch_ids() == []
