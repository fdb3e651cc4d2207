"""The data source as :func:`sinks.register` bakes it for a Spark Connect session, which the
server's one-shot Python workers load to unpickle it (so here, beside the classic one, and not
with the client's side of Spark Connect: :mod:`sinks.driver.connect`)."""

from __future__ import annotations

from recovery.cql import credentials
from recovery.cql.errors import OptionError
from wal.schemes import LOCAL_SCHEME, is_local

from .source import CassandraWalDataSource


def is_relative(location: str) -> bool:
    """A local path that is not absolute (``cp``, ``file:cp``); a URI of a store is not."""
    if not is_local(location):
        return False
    path, local = location.strip(), f"{LOCAL_SCHEME}:"
    return not (path[len(local):] if path.lower().startswith(local) else path).startswith("/")


class ConnectCassandraWalDataSource(CassandraWalDataSource):
    """The data source as :func:`sinks.register` bakes it for a Spark Connect session: a stream
    is refused, before anything is staged, where the client's flusher could not follow it."""

    def streamWriter(self, schema, overwrite):
        """Refuse what the client's flusher cannot follow, then prepare the batch as usual.

        Runs: in a one-shot Python worker of the Connect server, once per micro-batch."""
        options = {str(k).lower(): v for k, v in self.options.items()}
        for option in ("checkpointLocation", "wal.path"):
            value = options.get(option.lower())
            if value and is_relative(str(value)):
                raise OptionError(option, str(value),
                                  "Spark Connect: must be absolute (or a URI): the server "
                                  "resolves a relative location against its own working "
                                  "directory, which the client's flusher does not know")
        if credentials.given_in(options):
            raise OptionError("spark.cassandra.auth.*", None,
                              "Spark Connect: credentials given as write options reach only "
                              "the server, not the client process that writes the batches; "
                              "set them with spark.conf.set(...) before sinks.register(spark), "
                              "or CASSANDRA_WAL_USERNAME / CASSANDRA_WAL_PASSWORD in the "
                              "client's environment")
        return super().streamWriter(schema, overwrite)
