"""Where things live under a WAL directory (see ``wal/FORMAT.md``, "Directory")."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property

from . import clock
from . import format as fmt
from .errors import NotAWal, UnsupportedFormat, WalCorrupted
from .files import atomic_write, fsync_dir, make_private_dirs
from .remote import RemoteWal, make_working_copy, read_remote_uri, working_copy_of
from .schemes import is_remote


@dataclass(frozen=True)
class WalDir:
    """The paths of one WAL. Creating the object touches nothing on disk.

    A WAL on a store (:mod:`wal.remote`) is worked on through a local folder, its working copy
    (``root``, which names the store in its ``REMOTE`` file) or, in a task, a spool
    (``spool_for``: the store's URI; segments leave it once published): every write below
    that the guarantee needs is published to the store as well, before it returns."""

    root: str
    spool_for: str | None = None

    @cached_property
    def remote(self) -> RemoteWal | None:
        """The store this WAL lives on (None: the local folder is the WAL)."""
        uri = self.spool_for or read_remote_uri(self.root)
        return RemoteWal.at(uri) if uri else None

    @classmethod
    def at(cls, location: str) -> "WalDir":
        """The WAL at ``location`` as this host works on it: a local folder as is; on a store
        (``hdfs://``, ``s3a://``...), this host's working copy of it (made if missing, with the
        store's small files pulled in). Nothing is created for a local folder."""
        if not is_remote(location):
            return cls(location)
        root = working_copy_of(location)
        make_working_copy(root, location)
        wal = cls(root)
        if wal.remote.is_stale(root):
            # Moved aside, not emptied: a flusher of the old WAL in this process may still
            # hold its RocksDB log open; what it writes there now reaches nothing.
            stale = f"{root}.stale-{clock.wall_ns()}"
            os.rename(root, stale)
            shutil.rmtree(stale, ignore_errors=True)
            make_working_copy(root, location)
            wal = cls(root)
        wal.remote.pull_state(root)
        return wal

    @property
    def location(self) -> str:
        """Where the WAL is: its store's URI, or the local folder."""
        return self.remote.uri if self.remote else self.root

    @property
    def marker(self) -> str:
        return os.path.join(self.root, fmt.MARKER_FILE)

    @property
    def target_file(self) -> str:
        return os.path.join(self.root, fmt.TARGET_FILE)

    @property
    def segments(self) -> str:
        return os.path.join(self.root, fmt.SEGMENTS_DIR)

    @property
    def seals(self) -> str:
        return os.path.join(self.root, fmt.SEALS_DIR)

    @property
    def log(self) -> str:
        return os.path.join(self.root, fmt.LOG_DIR)

    @property
    def entries(self) -> str:
        return os.path.join(self.root, fmt.ENTRIES_DIR)

    def entry_path(self, batch_id: int) -> str:
        return os.path.join(self.entries, fmt.batch_name(batch_id) + fmt.ENTRY_SUFFIX)

    @property
    def amendments(self) -> str:
        return os.path.join(self.root, fmt.AMENDMENTS_DIR)

    def amendment_path(self, batch_id: int) -> str:
        return os.path.join(self.amendments, fmt.batch_name(batch_id) + fmt.AMENDMENT_SUFFIX)

    def batch_segments(self, batch_id: int) -> str:
        return os.path.join(self.segments, fmt.batch_name(batch_id))

    def segment_path(self, relative: str) -> str:
        return os.path.join(self.segments, relative)

    def seal_path(self, batch_id: int) -> str:
        return os.path.join(self.seals, fmt.batch_name(batch_id) + fmt.SEAL_SUFFIX)

    # -- creation and checks -------------------------------------------------------------
    def create(self) -> "WalDir":
        """Create the folders (mode 0700) and the format marker; idempotent."""
        for path in (self.root, self.segments, self.seals):
            make_private_dirs(path)
        if not os.path.exists(self.marker):
            body = json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION})
            if self.remote:
                self.remote.publish_once(fmt.MARKER_FILE, body.encode() + b"\n")
            atomic_write(self.marker, body.encode() + b"\n")
        return self

    def check(self) -> "WalDir":
        """Raise NotAWal / UnsupportedFormat unless this is a WAL we can read."""
        if not os.path.isdir(self.root):
            raise NotAWal(self.root, "no such directory")
        try:
            with open(self.marker, "rb") as f:
                body = json.loads(f.read() or b"null")
        except FileNotFoundError:
            raise NotAWal(self.root) from None
        except (OSError, ValueError) as exc:
            raise NotAWal(self.root, f"unreadable {fmt.MARKER_FILE}: {exc}") from None
        if not isinstance(body, dict) or body.get("format") != fmt.FORMAT_NAME:
            raise NotAWal(self.root, f"{fmt.MARKER_FILE} does not name {fmt.FORMAT_NAME}")
        if body.get("version") not in (fmt.FORMAT_VERSION, fmt.FORMAT_CHANGES):
            raise UnsupportedFormat(self.root, body.get("version"), fmt.FORMAT_CHANGES)
        return self

    def hold_changes(self) -> None:
        """Before a change stream stages its first batch here: ``WAL_FORMAT`` version
        :data:`~wal.format.FORMAT_CHANGES`, which a release before change streams refuses
        (it would write the deletes of a pending batch as upserts). A local or shared folder
        only: a store's marker is create-only (FORMAT.md, "Directory")."""
        if self.remote is not None:
            return
        with open(self.marker, "rb") as f:
            body = json.loads(f.read())
        if body.get("version") != fmt.FORMAT_CHANGES:
            atomic_write(self.marker, json.dumps(dict(body, version=fmt.FORMAT_CHANGES))
                         .encode() + b"\n")

    # -- listings ------------------------------------------------------------------------
    def sealed_batch_ids(self) -> list[int]:
        return sorted(_ids(self.seals, fmt.SEAL_SUFFIX))

    def staged_batch_ids(self) -> list[int]:
        return sorted(_ids(self.segments, ""))

    def segment_files(self, batch_id: int) -> list[str]:
        """Relative names (``<batch>/<file>``) of the complete segment files of a batch."""
        folder = self.batch_segments(batch_id)
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return []
        return [f"{fmt.batch_name(batch_id)}/{n}" for n in names if n.endswith(fmt.SEGMENT_SUFFIX)]

    def read_flushed_through(self) -> int:
        """The shared copy of the highest flushed batch id (-1: none). It lets the RocksDB log,
        a local working copy, be lost and rebuilt from the files without replaying batches
        whose segments are already gone."""
        try:
            with open(os.path.join(self.root, fmt.FLUSHED_THROUGH_FILE), "rb") as f:
                return int(f.read().strip() or -1)
        except (FileNotFoundError, ValueError):
            return -1

    def write_flushed_through(self, batch: int) -> None:
        if batch > self.read_flushed_through():
            # The store's marker first: were it written second and failed, the local copy
            # would say "published" and nothing would publish it again.
            if self.remote:
                self.remote.publish_flushed(batch)
            atomic_write(os.path.join(self.root, fmt.FLUSHED_THROUGH_FILE), b"%d\n" % batch)

    def read_blocked(self) -> str | None:
        """Why the flusher cannot go on (None: it can). A stream's next commit fails with it."""
        try:
            with open(os.path.join(self.root, fmt.BLOCKED_FILE), "rb") as f:
                return str(json.loads(f.read()).get("reason", ""))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:   # torn by hand: still blocked, say why not clearer
            return f"unreadable {fmt.BLOCKED_FILE}: {exc}"

    def write_blocked(self, reason: str | None) -> None:
        """Record why the flusher cannot go on, or (None) that it can again."""
        path = os.path.join(self.root, fmt.BLOCKED_FILE)
        if reason is None:
            if not os.path.exists(path):
                return
            os.unlink(path)
            body = None
        else:
            unchanged = self.read_blocked() == reason    # the flusher retries every few s
            body = json.dumps({"reason": reason, "at": clock.wall_s()}).encode()
            atomic_write(path, body)
            if unchanged and (self.remote is None
                              or self.remote.store.read(fmt.BLOCKED_FILE) is not None):
                return
        if self.remote:
            self.remote.replace(fmt.BLOCKED_FILE, body)

    def read_moved(self) -> tuple[str, int] | None:
        """``(where the stream's WAL moved to, the last batch this WAL holds)``, if the stream
        moved away from this WAL (:mod:`wal.move`); None while it is the stream's WAL."""
        path = os.path.join(self.root, fmt.MOVED_FILE)
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            return str(d["to"]), int(d["after"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WalCorrupted(path, f"unreadable {fmt.MOVED_FILE}: {exc}") from None

    def write_moved(self, moved: tuple[str, int] | None) -> None:
        """Record that the stream moved away from this WAL after batch ``moved[1]`` (None:
        it is the stream's WAL again): on a store, there first."""
        path = os.path.join(self.root, fmt.MOVED_FILE)
        body = None if moved is None else \
            json.dumps({"to": moved[0], "after": moved[1]}).encode() + b"\n"
        if self.remote:
            self.remote.replace(fmt.MOVED_FILE, body)
        if body is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            fsync_dir(self.root)    # gone for good: a crash must not bring it back
        else:
            atomic_write(path, body)

    def read_target(self) -> dict | None:
        try:
            with open(self.target_file, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise WalCorrupted(self.target_file, f"unreadable target.json: {exc}") from None

    def write_target(self, target: dict) -> None:
        """Record what this WAL writes to (never secrets: see recovery.target.RecordedTarget)."""
        body = json.dumps(target, indent=2, sort_keys=True).encode()
        if self.remote:
            self.remote.publish_target(body)
        atomic_write(self.target_file, body)


def _ids(folder: str, suffix: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if suffix and not name.endswith(suffix):
            continue
        stem = name[: -len(suffix)] if suffix else name
        if stem.isdigit():
            out.append(int(stem))
    return out
