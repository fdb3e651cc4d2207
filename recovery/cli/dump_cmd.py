"""``cassandra-wal dump``: the rows of one batch as JSON lines, streamed chunk by chunk.

Where the rows come from, in order of preference:

1. the log, when the batch was ingested there (SEALED, FLUSHING, FLUSHED): exactly what the
   flusher writes;
2. the segments named by the batch's seal (sealed, not ingested yet);
3. every complete segment file of the batch (staged: no seal yet). These are *unsealed*: every
   task attempt, losing ones included, so a note on stderr says so and each row names its
   ``_segment``.

Every chunk is checksum-verified as it is read; one chunk is decoded at a time, so a batch of
any size dumps in bounded memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from recovery.cli import EXIT_OK, CliError, guarded, log_errors, note
from recovery.cli.location import (
    WAL_DIR_HELP,
    read_only_wal,
    removed_while_reading,
    segment_to_read,
)
from recovery.cli.render import column_values, field_schema
from wal.errors import SegmentMissing, WalCorrupted
from wal.layout import WalDir
from wal.log import WalLog
from wal.seal import Seal, read_seal
from wal.segment import SegmentReader, decode_chunk
from wal.states import BatchState

NAME = "dump"

EPILOG = """\
output: one JSON object per row, the columns by name, plus
  "_partition"     the Spark partition that wrote the row
  "_row"           the row's position in the batch (unsealed: its position in this output)
  "_writetime_us"  its Cassandra write timestamp, base_ts_us + _row (sealed batches only)
  "_segment"       the segment file it comes from (unsealed batches only)

values:
  string, number, boolean  as JSON; NaN, Infinity, -Infinity as strings; float as its
                           shortest round-trip form; integers exact (any size)
  decimal                  string, exact, with the column's scale: "12.3400"
  timestamp                "2024-02-29T23:59:59.123456+00:00" (microseconds always; no
                           offset for timestamps without time zone, TIMESTAMP_NTZ)
  date                     "2024-02-29"
  binary                   {"$base64": "AAH+/w=="}
  uuid                     its string, as is
  list, set (array)        array
  map                      object, or [[key, value], ...] when keys are not strings
  struct                   object
  null                     null

Rows come from the log when the batch was ingested, else from the segments its seal names,
else (no seal) from every segment file of the batch, with a note on stderr.

Examples:
  cassandra-wal dump /data/wal --batch 42
  cassandra-wal dump /data/wal --batch 42 --partition 3 --limit 10
  cassandra-wal dump /data/wal --batch 42 --json-schema
  cassandra-wal dump /data/wal --batch 42 | jq -c 'select(.amount == null)'"""


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="print the rows of one batch as JSON lines",
                       description="Print the rows of one batch as JSON lines (one object "
                                   "per row),\ntyped values rendered exactly. Streams: "
                                   "one chunk in memory at a time.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    p.add_argument("--batch", metavar="N", type=_non_negative, required=True,
                   help="the batch id")
    p.add_argument("--partition", metavar="P", type=_non_negative,
                   help="only the rows of Spark partition P")
    p.add_argument("--limit", metavar="K", type=_non_negative,
                   help="stop after K rows")
    p.add_argument("--json-schema", action="store_true",
                   help="print a JSON Schema (draft 2020-12) of the output lines instead of "
                        "the rows")
    p.add_argument("--json", action="store_true",
                   help="accepted for symmetry: the output is always JSON")
    p.set_defaults(run=run)
    return p


@dataclass(frozen=True)
class Piece:
    """One verified chunk of the batch, and where its rows sit."""

    partition: int
    first_row: int
    payload: bytes
    segment: str | None = None      # set for unsealed segments only


class Source:
    """Where a batch's rows are read from. ``pieces`` yields verified chunks in batch order."""

    kind = ""
    seal: Seal | None = None

    def pieces(self, partition: int | None) -> Iterator[Piece]:
        raise NotImplementedError


class LogSource(Source):
    kind = "log"

    def __init__(self, wal: WalDir, wal_log: WalLog, seal: Seal):
        self.wal, self.wal_log, self.seal = wal, wal_log, seal

    def pieces(self, partition):
        rows = [0] * len(self.seal.segments)
        for chunk in guarded(self.wal_log.chunks(self.seal.batch), self.wal):
            ref = self.seal.segments[chunk.segment_index]
            rows[chunk.segment_index] += chunk.rows
            if partition is None or ref.partition == partition:
                yield Piece(ref.partition, chunk.first_row, chunk.payload)
        for i, ref in enumerate(self.seal.segments):
            if rows[i] != ref.rows:
                raise WalCorrupted(self.wal.log, f"the log holds {rows[i]} rows of this segment, "
                                   f"its seal says {ref.rows}", batch=self.seal.batch,
                                   partition=ref.partition, segment=ref.name)


class SealSource(Source):
    kind = "sealed segments"

    def __init__(self, wal: WalDir, seal: Seal, flushed_through: int = -1,
                 seal_file_read: bool = True):
        """``flushed_through`` and ``seal_file_read``: what was read when this source was
        chosen, to tell a segment the running sink removed meanwhile from a lost one."""
        self.wal, self.seal = wal, seal
        self.flushed_through, self.seal_file_read = flushed_through, seal_file_read

    def pieces(self, partition):
        for ref, offset in zip(self.seal.segments, self.seal.row_offsets()):
            if partition is not None and ref.partition != partition:
                continue
            path = segment_to_read(self.wal, ref.name)
            reader = SegmentReader(path, self.seal.batch, ref.partition, ref.name)
            seen = 0
            try:
                for chunk in reader.chunks():
                    yield Piece(ref.partition, offset + seen, chunk.payload)
                    seen += chunk.rows
            except SegmentMissing:
                batch = self.seal.batch
                if removed_while_reading(self.wal, batch, self.flushed_through,
                                         self.seal_file_read):
                    raise CliError(f"batch {batch} was flushed or removed by the running sink "
                                   f"while dump read its segment {ref.name}",
                                   "run the same dump again: a flushed batch's rows are read "
                                   "from the log until retention removes them") from None
                raise WalCorrupted(path, "segment named by the seal is missing", batch=batch,
                                   partition=ref.partition, segment=ref.name) from None
            if reader.verified_crc != ref.crc32 or reader.verified_rows != ref.rows:
                raise WalCorrupted(path, "segment differs from what its seal records",
                                   batch=self.seal.batch, partition=ref.partition,
                                   segment=ref.name)


class UnsealedSource(Source):
    kind = "unsealed segments"

    def __init__(self, wal: WalDir, batch: int, names: list[str], why: str = "has no seal"):
        self.wal, self.batch, self.names, self.why = wal, batch, names, why

    def pieces(self, partition):
        seen = 0
        for name in self.names:
            path = self.wal.segment_path(name)
            reader = SegmentReader(path, self.batch, None, name)
            try:
                part = int(reader.header()["partition"])
            except FileNotFoundError:
                continue        # removed meanwhile (a live sink cleaning up losing attempts)
            except (KeyError, TypeError, ValueError):
                raise WalCorrupted(path, "segment header has no partition", batch=self.batch,
                                   segment=name) from None
            if partition is not None and part != partition:
                continue
            reader.partition = part
            for chunk in reader.chunks():
                yield Piece(part, seen, chunk.payload, segment=name)
                seen += chunk.rows


def choose_source(wal: WalDir, wal_log: WalLog | None, batch: int) -> Source:
    """Where to read ``batch`` from; CliError when the WAL holds no rows for it."""
    with log_errors(wal):
        record = wal_log.get(batch) if wal_log is not None else None
        flushed_through = max(wal_log.flushed_through() if wal_log is not None else -1,
                              wal.read_flushed_through())
    in_log = record is not None and record.seal is not None and record.state in (
        BatchState.SEALED, BatchState.FLUSHING, BatchState.FLUSHED)
    if in_log and record.rows_in_log and (record.state != BatchState.FLUSHED
                                          or _log_has_rows(wal, wal_log, batch)):
        return LogSource(wal, wal_log, record.seal)
    discarded = record is not None and record.state == BatchState.DISCARDED
    reason = f" ({record.reason})" if discarded and record.reason else ""
    seal = read_seal(wal, batch)
    from_log = seal is None and in_log
    if from_log:
        seal = record.seal
    if seal is not None:
        retained = (record is None and batch <= flushed_through) or (
            record is not None and record.state == BatchState.FLUSHED)
        if retained and not all(os.path.exists(wal.segment_path(s.name))
                                for s in seal.segments):
            if record is not None and not record.rows_in_log:
                raise CliError(f"batch {batch} was written by flush tasks that read its "
                               f"segments, which went once it was flushed: its rows were "
                               f"never copied into the log (only its seal is kept)",
                               "wal.flush.mode=driver keeps flushed rows for "
                               "wal.retention.batches")
            raise CliError(f"batch {batch} was flushed and retention removed its rows "
                           f"(only its seal is kept)")
        if discarded:
            note(f"the log says batch {batch} was discarded{reason}; this seal is from a "
                 f"later run of the batch, or a leftover of that discard")
        return SealSource(wal, seal, flushed_through, seal_file_read=not from_log)
    names = wal.segment_files(batch)
    if names:
        why = f"was discarded{reason} and has no seal" if discarded else "has no seal"
        return UnsealedSource(wal, batch, names, why)
    if discarded:
        raise CliError(f"batch {batch} was discarded{reason}: the WAL holds no rows for it")
    raise CliError(f"batch {batch} is not in {wal.root}",
                   f"run 'cassandra-wal inspect {wal.root}' to list its batches")


def _log_has_rows(wal: WalDir, wal_log: WalLog, batch: int) -> bool:
    with log_errors(wal):
        return next(iter(wal_log.chunks(batch)), None) is not None


def _decode(piece: Piece, batch: int, path: str) -> pa.RecordBatch:
    try:
        return decode_chunk(piece.payload)
    except (pa.ArrowException, ValueError) as exc:
        raise WalCorrupted(path, f"chunk is not a valid Arrow stream: {exc}", batch=batch,
                           partition=piece.partition, segment=piece.segment) from None


def _schema(source: Source, batch: int, wal: WalDir) -> pa.Schema | None:
    for piece in source.pieces(None):
        return _decode(piece, batch, wal.root).schema
    return None


def json_schema(schema: pa.Schema | None, batch: int, source: Source) -> dict:
    sealed, unsealed = source.seal is not None, isinstance(source, UnsealedSource)
    props: dict = {}
    for f in schema or []:
        props[f.name] = field_schema(f)
    meta = {"_partition": {"type": "integer", "minimum": 0},
            "_row": {"type": "integer", "minimum": 0}}
    if sealed:
        meta["_writetime_us"] = {"type": "integer"}
    if unsealed:
        meta["_segment"] = {"type": "string"}
    props.update(meta)
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "title": f"cassandra-wal dump --batch {batch}",
           "description": f"one row of batch {batch}, read from the {source.kind}",
           "type": "object",
           "required": list(props), "properties": props, "additionalProperties": False}
    if schema is None:
        out["description"] += "; the batch holds no rows, so its columns are unknown"
    return out


def run(args) -> int:
    wal = read_only_wal(args.wal_dir, segments=True)
    wal_log = WalLog.open_reader(wal)
    try:
        source = choose_source(wal, wal_log, args.batch)
        if isinstance(source, UnsealedSource):
            note(f"batch {args.batch} {source.why}: these rows come from its "
                 f"{len(source.names)} unsealed segment file(s), losing task attempts "
                 f"included; _row counts rows in this output and there are no write "
                 f"timestamps")
        out = sys.stdout
        if args.json_schema:
            schema = _schema(source, args.batch, wal)
            json.dump(json_schema(schema, args.batch, source), out, indent=2)
            out.write("\n")
            return EXIT_OK
        if write_rows(source, args, wal, out) == 0 and args.limit != 0:
            where = "" if args.partition is None else f" in partition {args.partition}"
            note(f"batch {args.batch} holds no rows{where}")
    finally:
        if wal_log is not None:
            wal_log.close()
    return EXIT_OK


def write_rows(source: Source, args, wal: WalDir, out) -> int:
    """Stream the rows; returns how many were written."""
    limit, written = args.limit, 0
    base = source.seal.base_ts_us if source.seal is not None else None
    if limit == 0:
        return 0
    for piece in source.pieces(args.partition):
        record_batch = _decode(piece, args.batch, wal.root)
        names = record_batch.schema.names
        columns = [column_values(c) for c in record_batch.columns]
        for i in range(record_batch.num_rows):
            row = {"_partition": piece.partition, "_row": piece.first_row + i}
            if base is not None:
                row["_writetime_us"] = base + piece.first_row + i
            if piece.segment is not None:
                row["_segment"] = piece.segment
            row.update(zip(names, (col[i] for col in columns)))
            out.write(json.dumps(row, ensure_ascii=False, allow_nan=False))
            out.write("\n")
            written += 1
            if limit is not None and written >= limit:
                out.flush()
                return written
    out.flush()
    return written
