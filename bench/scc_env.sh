#!/usr/bin/env bash
# Run the Spark Cassandra Connector contestant of bench/bench_sinks.py in its own venv.
#
#   bench/scc_env.sh setup          # create .cache/bench-scc-venv (pyspark 3.5.x), warm the jar
#   bench/scc_env.sh run ARGS...    # python bench/contestants/scc.py ARGS... in that venv
#
# The connector is a JVM jar for Spark 3.5 / Scala 2.12 (no release for Spark 4 yet, see
# /work/shared/docs/anchors.md), so it cannot run in the project's pyspark 4.3 venv. Spark
# resolves it from Maven Central through spark.jars.packages (SCC_PACKAGE below) into the
# Ivy cache (.cache/bench-scc-ivy). Override: SCC_VENV, SCC_PYSPARK, SCC_PACKAGE, SCC_PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCC_VENV:-$ROOT/.cache/bench-scc-venv}"
PYSPARK="${SCC_PYSPARK:-pyspark==3.5.*}"
export SCC_PACKAGE="${SCC_PACKAGE:-com.datastax.spark:spark-cassandra-connector_2.12:3.5.1}"
export SCC_IVY="${SCC_IVY:-$ROOT/.cache/bench-scc-ivy}"
PYTHON="${SCC_PYTHON:-python3}"

# Ivy settings with Maven Central only: Spark's default chain also tries ~/.m2, where a pom
# without its jar (left by other builds) makes the whole resolution fail
# ("download failed: org.apache.commons#commons-lang3;3.10!commons-lang3.jar").
export SCC_IVY_SETTINGS="$SCC_IVY/ivysettings.xml"

setup() {
    mkdir -p "$SCC_IVY"
    cat > "$SCC_IVY_SETTINGS" <<XML
<ivysettings>
  <settings defaultResolver="central"/>
  <caches defaultCacheDir="$SCC_IVY/cache"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="https://repo1.maven.org/maven2/"/>
  </resolvers>
</ivysettings>
XML
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import pyspark, sys; sys.exit(0 if pyspark.__version__.startswith('3.5') else 1)" 2>/dev/null; then
        "$VENV/bin/pip" install --quiet "$PYSPARK" "pyarrow" "pandas<3" "numpy<2" psutil
    fi
    # Resolve the connector once (and fail here, with Ivy's message, if Maven Central is unreachable).
    "$VENV/bin/python" "$ROOT/bench/contestants/scc.py" --resolve-only
}

case "${1:-}" in
    setup) setup ;;
    run) shift; setup >&2
         export PYSPARK_PYTHON="$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
         exec "$VENV/bin/python" "$ROOT/bench/contestants/scc.py" "$@" ;;
    *) echo "usage: $0 setup | run ARGS..." >&2; exit 2 ;;
esac
