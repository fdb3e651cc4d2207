"""The seams where the simulation replaces what lies outside the sink's process.

Only the world is faked, through the seams the code has for it: the clocks, sleeps and waits
(``wal.clock``: retention ages, seal timestamps and retry back-offs follow the seed), the named
crash points (``wal.crashpoints.on_point``: a crash point armed by the world raises
:class:`SimCrash`, which no ``except Exception`` in the sink catches, so the "process" dies
right there), the Cassandra connection and the table lookup where they are defined
(``recovery.cql.connection.connect``, ``recovery.cql.table.fetch_table_schema``), Spark's ``TaskContext``
(``sinks.worker.source._task``), the store scheme ``simstore://`` (``wal.stores``,
:mod:`tests.sim.store`) and the disk (:mod:`tests.sim.disk`); and a spy on the seals written
(``wal.seal.write_seal``). Everything else is the real code. Patches go in once per test and
delegate to the current world; older code without the seams gets them patched into each of its
modules that holds one (:meth:`Patches._install_into_modules`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time as real_time

#: The sink's top-level packages: the three of today, and the two that commits before issue 36
#: had at the top (the simulation replays older commits too).
SINK_PACKAGES = ("wal", "recovery", "sinks", "cql", "cli")
# Imported before patching, so every module of the sink that the simulation reaches is seen.
MODULES = ("wal.seal", "wal.log", "wal.catalog", "wal.retention", "wal.checkpoint",
           "cql.clock", "recovery.cql.connection", "recovery.cql.table", "recovery.cql.upsert", "recovery.replay",
           "recovery.output", "recovery.flusher", "recovery.executors", "recovery.batch_jobs",
           "recovery.recover", "sinks.worker.plan", "sinks.worker.source", "sinks.worker.batch_jobs",
           "sinks.driver.registry", "sinks.driver.wait",
           "recovery.cli.recover_cmd")


def has_seams() -> bool:
    """The code under test reads every clock through ``wal.clock`` and calls its crash points'
    hook (``wal.crashpoints.on_point``); older code is patched module by module."""
    try:
        import wal.crashpoints
    except ImportError:
        return False
    return has_module("wal.clock") and hasattr(wal.crashpoints, "on_point")


def has_module(name: str) -> bool:
    """The code under test has module ``name`` (``wal.remote``) in its own tree. Not an
    import: under an editable install of another checkout (a venv's), a module the code
    under test lacks would be imported from that checkout instead."""
    package, _, leaf = name.rpartition(".")
    try:
        folder = os.path.dirname(importlib.import_module(package).__file__)
    except ImportError:
        return False
    return os.path.exists(os.path.join(folder, leaf + ".py"))


class SimCrash(BaseException):
    """The simulated driver process dies at this point (a BaseException: nothing catches it)."""


class Current:
    """The world the patched functions act on (one schedule at a time per process)."""

    world = None


class SimTime:
    """The ``time`` module as the sink sees it: wall clock and monotonic clock are the world's
    clock, as the machine running the code reads them (:mod:`tests.sim.clocks`: its wall
    clock's offset, its monotonic clock's origin; none in a world without clocks), and a
    sleep moves that clock instead of waiting."""

    def time_ns(self) -> int:
        world = Current.world
        return (world.clock_us + world.clocks.wall_offset()) * 1000

    def time(self) -> float:
        world = Current.world
        return (world.clock_us + world.clocks.wall_offset()) / 1e6

    def monotonic(self) -> float:
        world = Current.world
        return (world.clock_us + world.clocks.mono_origin()) / 1e6

    def monotonic_ns(self) -> int:
        world = Current.world
        return (world.clock_us + world.clocks.mono_origin()) * 1000

    def sleep(self, seconds: float) -> None:
        Current.world.clock_us += max(0, int(seconds * 1e6))

    def __getattr__(self, name):
        return getattr(real_time, name)


SIM_TIME = SimTime()
_REAL_TO_SIM = {real_time.sleep: SIM_TIME.sleep, real_time.monotonic: SIM_TIME.monotonic,
                real_time.time: SIM_TIME.time, real_time.time_ns: SIM_TIME.time_ns,
                real_time.monotonic_ns: SIM_TIME.monotonic_ns}


def _crash_point(name: str) -> None:
    Current.world.crash_point(name)


def _task():
    return Current.world.task_context


def _machine_id() -> str:
    return Current.world.clocks.machine_id()


def _spy_write_seal(real):
    """``wal.seal.write_seal``, telling the world every seal written: a batch job's commit
    returns nothing, and a crash right after the seal leaves a seal its caller never saw."""
    def write_seal(wal, seal, *args, **kwargs):
        result = real(wal, seal, *args, **kwargs)
        world = Current.world
        world.seals_written.append(seal)
        # When it was sealed, on the world's clock, and the sealing clock's offset then.
        world.seal_clocks.setdefault(seal.seal_id, (world.clock_us, world.clocks.wall_offset()))
        return result
    return write_seal


def _no_wait(_seconds):
    import tenacity

    return tenacity.stop_after_attempt(1)


def _fetch_table_schema(_cluster, keyspace: str, table: str):
    return Current.world.tables[table]


def _connect(connection=None):
    return Current.world.node.connect(connection)


class Patches:
    """Install every seam; ``undo`` restores the modules."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []

    def _set(self, owner, name: str, value) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def install(self) -> "Patches":
        for name in MODULES:
            try:
                importlib.import_module(name)
            except ImportError:   # a module the code under test does not have
                pass
        import recovery.cql.connection
        import recovery.cql.table
        import sinks.worker.source
        import wal.seal

        self._set(sinks.worker.source, "_task", _task)
        self._set(wal.seal, "write_seal", _spy_write_seal(wal.seal.write_seal))
        self._install_store()
        from . import disk

        disk.install(self)                  # the disk's seams (disk.py)
        if has_seams():
            # The code's own seams: its one clock, its crash points' hook, its session factory
            # and table lookup where they are defined.
            import wal.clock
            import wal.crashpoints

            self._set(wal.clock, "time", SIM_TIME)
            self._set(wal.clock, "machine_id", _machine_id)
            self._set(wal.clock, "stop_waiting_after", _no_wait)
            self._set(wal.crashpoints, "on_point", _crash_point)
            self._set(recovery.cql.connection, "connect", _connect)
            self._set(recovery.cql.table, "fetch_table_schema", _fetch_table_schema)
        else:
            self._install_into_modules()
        return self

    def _install_into_modules(self) -> None:
        """Older code, without :func:`has_seams`: the same seams patched into every module of
        the sink that holds them (``time``, ``crash_point``, ``connect``...)."""
        import tenacity
        import tenacity.nap

        import recovery.cql.connection
        import recovery.cql.table

        seams = {recovery.cql.connection.connect: _connect,
                 recovery.cql.table.fetch_table_schema: _fetch_table_schema}
        for module in self._sink_modules():
            for name in ("connect", "fetch_table_schema"):
                if getattr(module, name, None) in seams:
                    self._set(module, name, seams[getattr(module, name)])
        for module_name in ("cql.clock", "recovery.cql.batch_age"):
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, "machine_id"):
                self._set(module, "machine_id", _machine_id)
        for module in (tenacity, tenacity.nap):
            self._set(module, "time", SIM_TIME)
        for module in self._sink_modules():
            if getattr(module, "time", None) is real_time:
                self._set(module, "time", SIM_TIME)
            if getattr(module, "crash_point", None) is not None and module.__name__ != "wal.crashpoints":
                self._set(module, "crash_point", _crash_point)
            if getattr(module, "stop_after_delay", None) is tenacity.stop_after_delay:
                # Waiting for a lock (a WAL's writer, a job's) is pointless here: the world
                # is sequential, nothing lets go meanwhile; the last attempt's answer comes now.
                self._set(module, "stop_after_delay", _no_wait)
            self._patch_defaults(module)

    def _install_store(self) -> None:
        """``simstore://`` (:mod:`tests.sim.store`) as one more store scheme: opened by
        ``wal.stores.open_store`` and accepted by ``sinks.worker.plan.resolve_location``. Older code
        without stores has neither seam, and its worlds get no store."""
        try:
            import sinks.worker.plan
            import wal.stores
        except ImportError:
            return
        from . import store

        if hasattr(wal.stores, "_open_remote"):
            self._set(wal.stores, "_open_remote", store.open_remote(wal.stores._open_remote))
        try:
            import wal.schemes
        except ImportError:     # older code: a list of store schemes of its own
            pass
        else:
            # The one table of schemes (since issue 36): simstore:// as a store of its own kind.
            self._set(wal.schemes, "SCHEMES", {**wal.schemes.SCHEMES, store.SCHEME: store.SCHEME})
            return
        # wal.stores's since the seams, else sinks.worker.plan's
        for owner in (wal.stores, sinks.worker.plan):
            if hasattr(owner, "STORE_SCHEMES"):
                self._set(owner, "STORE_SCHEMES", (*owner.STORE_SCHEMES, store.SCHEME))
                break

    @staticmethod
    def _sink_modules():
        return [m for n, m in sorted(sys.modules.items())
                if m is not None and n.split(".")[0] in SINK_PACKAGES]

    def _patch_defaults(self, module) -> None:
        """Functions (and methods) whose default arguments are the real ``time.sleep`` or
        clocks (``sleep=time.sleep``): the simulated ones instead, or a wait would be real."""
        def functions():
            for obj in vars(module).values():
                if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                    yield obj
                elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                    for member in vars(obj).values():
                        if inspect.isfunction(member):
                            yield member

        for fn in functions():
            defaults = fn.__defaults__
            if defaults and any(_is_real_clock(d) for d in defaults):
                self._undo.append((fn, "__defaults__", defaults))
                fn.__defaults__ = tuple(_REAL_TO_SIM.get(d, d) if _is_real_clock(d) else d
                                        for d in defaults)
            kw = fn.__kwdefaults__
            if kw and any(_is_real_clock(d) for d in kw.values()):
                self._undo.append((fn, "__kwdefaults__", dict(kw)))
                fn.__kwdefaults__ = {k: _REAL_TO_SIM.get(d, d) if _is_real_clock(d) else d
                                     for k, d in kw.items()}
        for obj in vars(module).values():   # dataclass fields holding a clock (RateLimiter)
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                for name, value in list(vars(obj).items()):
                    if _is_real_clock(value):
                        self._set(obj, name, _REAL_TO_SIM[value])

    def undo(self) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            setattr(owner, name, value)


def _is_real_clock(value) -> bool:
    try:
        return value in _REAL_TO_SIM
    except TypeError:   # unhashable default
        return False
