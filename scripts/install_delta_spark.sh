#!/usr/bin/env bash
# Idempotent: fetches Delta Lake's own Spark connector (delta-spark, the reference implementation of
# the Delta protocol) from Maven Central for the interoperability tests (tests/spark/test_delta_spark_*.py),
# into .venv/share/airflow-provider-checkpoint/delta-spark/ (Maven's own cache, ~/.m2, keeps the
# downloads). Only the tests load these jars, into a Spark Connect server of their own: the provider
# never does (its Delta connector is delta-rs).
#
# delta-spark 4.4.0 is the release built against Spark 4.2.0 (its pom's spark-sql dependency), the
# pinned pyspark. Its own jars only: the libraries it also depends on (Hadoop, Parquet, Jackson,
# Scala) are pyspark's.
set -euo pipefail
cd "$(dirname "$0")/.."

DELTA_VERSION=4.4.0
SPARK_VERSION=4.2
ARTIFACTS=(
  "io.delta:delta-spark_2.13"
  "io.delta:delta-storage"
  "io.delta:delta-kernel-api"
  "io.delta:delta-kernel-defaults"
)
target=.venv/share/airflow-provider-checkpoint/delta-spark
marker="$target/.complete-$DELTA_VERSION"

if [ -f "$marker" ]; then
  echo "delta-spark $DELTA_VERSION present in $target"
  exit 0
fi
pyspark_version=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')
case "$pyspark_version" in
  "$SPARK_VERSION".*) ;;
  *)
    echo "error: delta-spark $DELTA_VERSION is built for Spark $SPARK_VERSION, the venv has pyspark $pyspark_version:" >&2
    echo "       set DELTA_VERSION in $0 to the delta-spark release built for it." >&2
    exit 1
    ;;
esac
if ! command -v mvn >/dev/null 2>&1; then
  echo "error: fetching delta-spark needs Maven (mvn): apt-get install -y maven" >&2
  exit 1
fi
rm -rf "$target"
mkdir -p "$target"
pom=$(mktemp -d)
trap 'rm -rf "$pom"' EXIT
{
  echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
  echo '<groupId>local</groupId><artifactId>delta-spark-jars</artifactId><version>1</version><dependencies>'
  for artifact in "${ARTIFACTS[@]}"; do
    echo "<dependency><groupId>${artifact%%:*}</groupId><artifactId>${artifact##*:}</artifactId>"
    echo "<version>$DELTA_VERSION</version><exclusions><exclusion><groupId>*</groupId>"
    echo '<artifactId>*</artifactId></exclusion></exclusions></dependency>'
  done
  echo '</dependencies></project>'
} >"$pom/pom.xml"
echo "fetching delta-spark $DELTA_VERSION (Maven Central) into $target"
if ! out=$(mvn -q -B -Dstyle.color=never -f "$pom/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/$target" 2>&1); then
  echo "$out" >&2
  exit 1
fi  # quiet Maven still prints terminal escape codes: shown only on failure
touch "$marker"
