#!/usr/bin/env bash
# Idempotent: fetches Spark Structured Streaming's own Kafka source (org.apache.spark:spark-sql-kafka-0-10_2.13,
# the release of the pinned pyspark) with its dependencies from Maven Central, for the side-by-side Kafka
# benchmark (`python scripts/benchmark.py kafka`). Jars pyspark already ships (any version) are left out, as
# `spark-submit --packages` leaves Spark's own classpath alone. Kept in
# ${XDG_CACHE_HOME:-~/.cache}/airflow-provider-checkpoint/spark-kafka-<version>/ (Maven's ~/.m2 keeps the
# downloads). Only the benchmark loads these jars: the provider's KafkaSource reads with confluent-kafka.
set -euo pipefail
cd "$(dirname "$0")/.."

SPARK_VERSION=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')
target="${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-checkpoint/spark-kafka-$SPARK_VERSION"
if [ -f "$target/.complete" ]; then
  echo "spark-sql-kafka $SPARK_VERSION present: $target"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "error: fetching spark-sql-kafka needs Maven (mvn): apt-get install -y maven" >&2
  exit 1
fi
pom=$(mktemp -d)
trap 'rm -rf "$pom"' EXIT
cat >"$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>local</groupId><artifactId>spark-kafka-jars</artifactId><version>1</version><dependencies>
<dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId>
<version>$SPARK_VERSION</version></dependency></dependencies></project>
POM
echo "fetching spark-sql-kafka-0-10_2.13 $SPARK_VERSION (Maven Central) into $target"
rm -rf "$target.partial"
mkdir -p "$target.partial"
if ! out=$(mvn -q -B -Dstyle.color=never -f "$pom/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory="$target.partial" 2>&1); then
  echo "$out" >&2
  exit 1
fi  # quiet Maven still prints terminal escape codes: shown only on failure
shipped="$(.venv/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars"
for jar in "$target.partial"/*.jar; do
  name=$(basename "$jar" .jar)
  artifact=${name%-[0-9]*}  # the artifact without its version
  if compgen -G "$shipped/$artifact-[0-9]*.jar" >/dev/null; then
    rm "$jar"  # Spark's classpath has it already
  fi
done
rm -rf "$target"
mv "$target.partial" "$target"
touch "$target/.complete"
echo "spark-sql-kafka $SPARK_VERSION: $(ls "$target"/*.jar | xargs -n1 basename | tr '\n' ' ')"
