"""``cassandra-wal verify``: check every checksum and every cross-reference of a WAL.

What is checked (``wal/FORMAT.md`` has the formats):

* the format marker (``WAL_FORMAT``) and the log's ``m/format``;
* every seal: its checksum line, that it is the seal of the batch its name says;
* every segment file: framing, every chunk's CRC, the footer and whole-file CRC; a segment the
  batch's seal names must also match the seal's CRC and row count, and must exist;
* the log (opened as a secondary, never the lock): every batch record, every ``r/`` chunk's
  CRC (through ``WalLog.chunks``), that SEALED/FLUSHING batches hold all their sealed rows,
  that progress never exceeds the rows, and that the seal file agrees with the seal the log
  ingested.

Findings have a severity: ``error`` (corruption: exit 3), ``warning`` (something is off but no
row is lost) or ``info`` (garbage that recovery or retention removes: losing task attempts,
``.tmp`` leftovers). Each names its batch and segment.

Beside a running sink, files go while they are read: a segment missing is first judged against
the ``flushed_through`` marker and the seal files as they are *then*
(``recovery.cli.location.removed_while_reading``), so a batch flushed or discarded meanwhile is a note.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field

from recovery.cli import EXIT_CORRUPT, EXIT_OK, PROG, clean, guarded, log_errors
from recovery.cli.location import (WAL_DIR_HELP, read_only_wal, removed_while_reading,
                          segment_to_read, shown)
from recovery.cli.render import human_bytes, table
from recovery.target import RecordedTarget
from wal import clock
from wal import format as fmt
from wal.errors import SegmentMissing, WalCorrupted
from wal.files import tree_size
from wal.layout import WalDir
from wal.log import BatchRecord, WalLog
from wal.seal import Seal, read_seal
from wal.segment import SegmentReader, SegmentRef
from wal.states import BatchState

NAME = "verify"
PROGRESS_EVERY_S = 2.0          # how often progress goes to stderr (tests set 0)

ERROR, WARNING, INFO = "error", "warning", "info"
IN_LOG = (BatchState.SEALED, BatchState.FLUSHING, BatchState.FLUSHED)

EPILOG = """\
severities:
  error    corruption: a checksum, framing or cross-reference does not match (exit 3)
  warning  something is off, but no row is lost (e.g. a segment gone whose rows the log holds)
  info     garbage recovery or retention removes: unsealed segments (losing task attempts),
           .tmp leftovers of crashed tasks, files this tool does not know; beside a running
           sink, the files of batches it flushed or discarded while verify read

Exit code 3 when any error was found, 0 otherwise. Progress goes to stderr every 2 s.
--json prints {"wal", "ok", "errors", "warnings", "infos", "checked", "problems": [...]}.

Examples:
  cassandra-wal verify /data/wal
  cassandra-wal verify /data/wal --json | jq '.problems[] | select(.severity == "error")'
  cp -a /data/wal /tmp/wal-copy && cassandra-wal verify /tmp/wal-copy"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="check every checksum of a WAL; exit 3 on corruption",
                       description="Check the format marker, every seal, every segment file "
                                   "(every chunk\nand the footer) and the log (every record "
                                   "and row chunk), and their\ncross-references. Read-only.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)
    return p


@dataclass
class Problem:
    severity: str
    detail: str
    batch: int | None = None
    segment: str | None = None      # relative to segments/, or the seal/log file at fault
    path: str | None = None
    offset: int | None = None


class Progress:
    """``verified 1234 MB / 5678 MB`` on stderr, at most every ``every`` seconds."""

    def __init__(self, total: int, every: float, monotonic=clock.monotonic):
        self.total, self.done, self.every, self.monotonic = total, 0, every, monotonic
        self.last = monotonic()

    def add(self, n: int) -> None:
        self.done += n
        now = self.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(f"{PROG}: verified {self.done / 1e6:.0f} MB / "
                  f"{max(self.total, self.done) / 1e6:.0f} MB", file=sys.stderr)


@dataclass
class Verifier:
    wal: WalDir
    progress: Progress
    problems: list[Problem] = field(default_factory=list)
    checked: dict = field(default_factory=lambda: {
        "format_version": fmt.FORMAT_VERSION, "seals": 0, "segments": 0, "segment_bytes": 0,
        "log": False, "log_batches": 0, "log_chunks": 0, "log_bytes": 0})

    def add(self, severity: str, detail: str, batch: int | None = None,
            segment: str | None = None, path: str | None = None,
            offset: int | None = None) -> None:
        self.problems.append(Problem(severity, detail, batch, segment, path, offset))

    def corrupted(self, exc: WalCorrupted, severity: str = ERROR, prefix: str = "",
                  batch: int | None = None, segment: str | None = None) -> None:
        self.add(severity, prefix + clean(exc.detail, self.wal),
                 exc.batch if exc.batch is not None else batch,
                 segment or exc.segment, exc.path, exc.offset)

    # -- seals ----------------------------------------------------------------------------
    def check_seals(self) -> dict[int, Seal]:
        seals: dict[int, Seal] = {}
        for name in _listdir(self.wal.seals):
            path = os.path.join(self.wal.seals, name)
            stem = name[:-len(fmt.SEAL_SUFFIX)] if name.endswith(fmt.SEAL_SUFFIX) else None
            if name.endswith(fmt.TMP_SUFFIX):
                self.add(INFO, "leftover temporary file (an interrupted seal write)", path=path,
                         segment=name)
                continue
            if stem is None or not stem.isdigit():
                self.add(INFO, "unexpected file in seals/", path=path, segment=name)
                continue
            batch = int(stem)
            self.checked["seals"] += 1
            try:
                seal = read_seal(self.wal, batch)
            except WalCorrupted as exc:
                self.corrupted(exc, batch=batch, segment=name)
                continue
            except OSError as exc:
                self.add(ERROR, f"seal unreadable: {exc.strerror or exc}", batch, name, path)
                continue
            if seal is None:            # removed meanwhile (retention of a live sink)
                continue
            if seal.batch != batch:
                self.add(ERROR, f"seal file of batch {batch} holds the seal of batch "
                         f"{seal.batch}", batch, name, path)
                continue
            prefix = fmt.batch_name(batch) + "/"
            strays = [s.name for s in seal.segments if not s.name.startswith(prefix)]
            if strays:
                self.add(ERROR, f"seal names segments of another batch: {', '.join(strays)}",
                         batch, name, path)
            seals[batch] = seal
        return seals

    # -- log ------------------------------------------------------------------------------
    def check_log(self, seals: dict[int, Seal]) -> tuple[dict[int, BatchRecord], int, set[int]]:
        """Returns (records, flushed_through, batches whose rows the log fully holds)."""
        try:
            wal_log = WalLog.open_reader(self.wal)
        except WalCorrupted as exc:
            self.corrupted(exc, segment="log/")
            return {}, self.wal.read_flushed_through(), set()
        if wal_log is None:
            self.add(INFO, "no log yet (nothing was ingested)", path=self.wal.log)
            return {}, self.wal.read_flushed_through(), set()
        self.checked["log"] = True
        try:
            try:
                with log_errors(self.wal):
                    records = {r.batch: r for r in wal_log.records()}
                    log_through = wal_log.flushed_through()
            except WalCorrupted as exc:
                self.corrupted(exc, segment="log/")
                return {}, self.wal.read_flushed_through(), set()
            held = set()
            for batch in sorted(records):
                if self.check_record(wal_log, records[batch], seals.get(batch), log_through):
                    held.add(batch)
            return records, max(log_through, self.wal.read_flushed_through()), held
        finally:
            wal_log.close()

    def check_record(self, wal_log: WalLog, record: BatchRecord, seal_file: Seal | None,
                     log_through: int) -> bool:
        """Check one batch record and its rows; True when the log holds all its rows.
        ``log_through``: the log's own ``m/flushed_through``."""
        batch, state, seal = record.batch, record.state, record.seal
        key = fmt.batch_key(batch).decode()
        self.checked["log_batches"] += 1
        if state not in IN_LOG:
            return False
        if seal is None:
            self.add(ERROR, f"log record is {state} but holds no seal", batch, key, self.wal.log)
            return False
        if seal.batch != batch:
            self.add(ERROR, f"log record of batch {batch} holds the seal of batch {seal.batch}",
                     batch, key, self.wal.log)
        if seal_file is not None and seal_file.seal_id != seal.seal_id:
            self.add(ERROR, f"seal file {seal_file.seal_id} differs from the seal the log "
                     f"ingested ({seal.seal_id}); the log's is the one flushed", batch,
                     fmt.batch_name(batch) + fmt.SEAL_SUFFIX, self.wal.seal_path(batch))
        if record.flushed_rows > seal.rows:
            self.add(ERROR, f"flushed_rows {record.flushed_rows} exceeds the batch's "
                     f"{seal.rows} rows", batch, key, self.wal.log)
        if record.next_segment > len(seal.segments):
            self.add(ERROR, f"flush progress at segment {record.next_segment} of "
                     f"{len(seal.segments)}", batch, key, self.wal.log)
        if state == BatchState.FLUSHED and batch > log_through:
            self.add(ERROR, f"batch is FLUSHED but m/flushed_through is {log_through}",
                     batch, key, self.wal.log)
        if not record.rows_in_log:
            return False    # a scale-out writer's batch: its segments hold the rows (checked)
        rows = [0] * len(seal.segments)
        chunks = [0] * len(seal.segments)
        try:
            for chunk in guarded(wal_log.chunks(batch), self.wal):
                if chunk.segment_index >= len(seal.segments):
                    self.add(ERROR, f"log rows of segment #{chunk.segment_index}, the seal has "
                             f"{len(seal.segments)}", batch, key, self.wal.log)
                    return False
                rows[chunk.segment_index] += chunk.rows
                chunks[chunk.segment_index] += 1
                self.checked["log_chunks"] += 1
                self.checked["log_bytes"] += len(chunk.payload)
                self.progress.add(len(chunk.payload))
        except WalCorrupted as exc:
            self.corrupted(exc, prefix="log: ", batch=batch, segment=key)
            return False
        if state == BatchState.FLUSHED and not any(chunks):
            return False                # rows already dropped: allowed once flushed
        whole = True
        for ref, n_rows, n_chunks in zip(seal.segments, rows, chunks):
            if n_rows != ref.rows or n_chunks != ref.chunks:
                whole = False
                self.add(ERROR, f"log holds {n_rows} rows in {n_chunks} chunks of this segment, "
                         f"its seal says {ref.rows} rows in {ref.chunks}", batch, ref.name,
                         self.wal.log)
        return whole

    # -- segments ---------------------------------------------------------------------------
    def check_segments(self, seals: dict[int, Seal], records: dict[int, BatchRecord],
                       flushed_through: int, held: set[int]) -> None:
        batches = set(seals) | {b for b, r in records.items() if r.seal and r.state in IN_LOG}
        for entry in _listdir(self.wal.segments):
            if entry.isdigit() and os.path.isdir(os.path.join(self.wal.segments, entry)):
                batches.add(int(entry))
            else:
                self.add(INFO, "unexpected entry in segments/", segment=entry,
                         path=os.path.join(self.wal.segments, entry))
        for batch in sorted(batches):
            record = records.get(batch)
            seal = seals.get(batch)
            if record is not None and record.seal is not None and record.state in IN_LOG:
                seal = record.seal      # the log's seal is the one that counts
            self.check_batch_segments(batch, seal, record, flushed_through, batch in held,
                                      batch in seals)

    def check_batch_segments(self, batch: int, seal: Seal | None, record: BatchRecord | None,
                             flushed_through: int, held: bool, seal_file_read: bool) -> None:
        folder = self.wal.batch_segments(batch)
        # Discarding removes a batch's files; a seal found after it is a re-run's (checked as
        # any seal), and segments without one are leftovers of the discard.
        discarded = record is not None and record.state == BatchState.DISCARDED and seal is None
        named = {ref.name: ref for ref in seal.segments} if seal else {}
        present = set()
        for file in _listdir(folder):
            name = f"{fmt.batch_name(batch)}/{file}"
            path = os.path.join(folder, file)
            if file.endswith(fmt.TMP_SUFFIX):
                self.add(INFO, "leftover .tmp file (a task still writing, or one that "
                         "crashed: garbage)", batch, name, path)
            elif not file.endswith(fmt.SEGMENT_SUFFIX):
                self.add(INFO, "unexpected file", batch, name, path)
            elif name in named:
                if self.check_segment(batch, name, named[name], path) is not None:
                    present.add(name)
            elif seal is not None or discarded:
                damage = self.check_segment(batch, name, None, path, quiet=True)
                extra = "" if damage in (None, "") else f"; also damaged: {damage}"
                what = ("segment of a discarded batch (garbage)" if discarded else
                        "unsealed (garbage): not named by the batch's seal (a losing or "
                        "earlier task attempt)")
                if damage is not None:
                    self.add(INFO, what + extra, batch, name, path)
            else:
                self.check_segment(batch, name, None, path)
        for name, ref in named.items():
            if name in present:
                continue
            path = self.wal.segment_path(name)
            fetched = segment_to_read(self.wal, name)     # a scale-out working copy's: the store's
            if fetched != path and self.check_segment(batch, name, ref, fetched) is not None:
                continue
            if (record is None and batch <= flushed_through) or (
                    record is not None and record.state == BatchState.FLUSHED):
                self.add(INFO, "segment removed once the batch was flushed", batch, name, path)
            elif removed_while_reading(self.wal, batch, flushed_through, seal_file_read):
                self.add(INFO, "segment removed while verify read: the running sink flushed "
                         "or removed its batch meanwhile", batch, name, path)
            elif held:
                self.add(WARNING, "segment named by the seal is missing; the log holds its rows",
                         batch, name, path)
            else:
                self.add(ERROR, "segment named by the seal is missing", batch, name, path)

    def check_segment(self, batch: int, name: str, ref: SegmentRef | None, path: str,
                      quiet: bool = False) -> str | None:
        """Verify one file. Returns None if it vanished (a running sink removes the files of
        a batch it flushed: the caller judges), "" if sound, else what is wrong (reported as an
        error unless ``quiet``)."""
        reader = SegmentReader(path, batch, ref.partition if ref else None, name)
        try:
            for chunk in reader.chunks():
                self.progress.add(len(chunk.payload) + fmt.CHUNK_HEAD.size)
            if ref is not None and (reader.verified_crc != ref.crc32
                                    or reader.verified_rows != ref.rows):
                raise WalCorrupted(path, f"segment differs from its seal: crc "
                                   f"{reader.verified_crc:#010x}/{reader.verified_rows} rows, "
                                   f"sealed {ref.crc32:#010x}/{ref.rows} rows",
                                   batch=batch, partition=ref.partition, segment=name)
        except SegmentMissing:      # SegmentReader reports a vanished file so
            return None
        except WalCorrupted as exc:
            if not quiet:
                self.corrupted(exc)
            self._count(path)
            return exc.detail + (f" at offset {exc.offset}" if exc.offset is not None else "")
        except OSError as exc:
            if not quiet:
                self.add(ERROR, f"unreadable: {exc.strerror or exc}", batch, name, path)
            return f"unreadable: {exc.strerror or exc}"
        self._count(path)
        return ""

    def _count(self, path: str) -> None:
        self.checked["segments"] += 1
        try:
            self.checked["segment_bytes"] += os.path.getsize(path)
        except OSError:
            pass

    def check_target(self) -> None:
        try:
            RecordedTarget.read(self.wal)
        except WalCorrupted as exc:
            self.add(WARNING, f"target.json unreadable ({exc.detail}): inspect cannot find the "
                     f"checkpoint by itself", segment=fmt.TARGET_FILE, path=self.wal.target_file)
        path = os.path.join(self.wal.root, fmt.FLUSHED_THROUGH_FILE)
        try:
            with open(path, "rb") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.add(ERROR, f"unreadable: {exc.strerror or exc}",
                     segment=fmt.FLUSHED_THROUGH_FILE, path=path)
            return
        if not text.lstrip(b"-").isdigit():
            self.add(ERROR, f"{fmt.FLUSHED_THROUGH_FILE} holds {text[:40]!r}, not a batch id",
                     segment=fmt.FLUSHED_THROUGH_FILE, path=path)

    def run(self) -> None:
        self.check_target()
        seals = self.check_seals()
        records, flushed_through, held = self.check_log(seals)
        self.check_segments(seals, records, flushed_through, held)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _segment_bytes(wal: WalDir) -> int:
    total = 0
    for root, _dirs, files in os.walk(wal.segments):
        for name in files:
            if name.endswith(fmt.SEGMENT_SUFFIX):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
    return total


def run(args) -> int:
    wal = read_only_wal(args.wal_dir, segments=True)
    progress = Progress(_segment_bytes(wal) + tree_size(wal.log), PROGRESS_EVERY_S)
    verifier = Verifier(wal, progress)
    verifier.run()
    problems = verifier.problems
    counts = {s: sum(1 for p in problems if p.severity == s) for s in (ERROR, WARNING, INFO)}
    ok = counts[ERROR] == 0
    out = sys.stdout
    if args.json:
        json.dump({"wal": shown(wal), "ok": ok, "errors": counts[ERROR],
                   "warnings": counts[WARNING], "infos": counts[INFO],
                   "checked": verifier.checked, "problems": [asdict(p) for p in problems]},
                  out, indent=2)
        out.write("\n")
        return EXIT_OK if ok else EXIT_CORRUPT
    if problems:
        order = {ERROR: 0, WARNING: 1, INFO: 2}
        rows = [(p.severity, "-" if p.batch is None else p.batch, p.segment or "-",
                 p.detail + (f" (offset {p.offset})" if p.offset is not None
                             and "offset" not in p.detail else ""))
                for p in sorted(problems, key=lambda p: order[p.severity])]
        print(table(("SEVERITY", "BATCH", "SEGMENT", "PROBLEM"), rows, right=("BATCH",)),
              file=out)
        print(file=out)
    c = verifier.checked
    log_summary = (f"log: {c['log_batches']} batches, {c['log_chunks']} row chunks "
                   f"({human_bytes(c['log_bytes'])})" if c["log"] else "no log")
    print(f"checked  format version {c['format_version']}, {c['seals']} seals, "
          f"{c['segments']} segment files ({human_bytes(c['segment_bytes'])}), {log_summary}",
          file=out)
    tail = f"{_count(counts[WARNING], 'warning')}, {_count(counts[INFO], 'note')}"
    if ok:
        print(f"result   OK: no corruption found ({tail})", file=out)
        return EXIT_OK
    print(f"result   CORRUPTED: {_count(counts[ERROR], 'error')}, {tail}", file=out)
    return EXIT_CORRUPT
