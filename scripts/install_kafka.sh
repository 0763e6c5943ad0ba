#!/usr/bin/env bash
# Idempotent: fetches Apache Kafka's broker (org.apache.kafka:kafka_2.13 with its dependencies, the
# version in scripts/kafka/pom.xml) from Maven Central into a cache kept between runs, for the tests'
# single-node KRaft broker (tests/servers/kafka.py). Needs Java 17+ (Kafka 4.x brokers) and mvn (apt, as root).
# The directory is $KAFKA_LIBS, else ~/.cache/airflow-provider-checkpoint/kafka-<version>/libs.
set -euo pipefail
cd "$(dirname "$0")/kafka"

version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' pom.xml)"
libs="${KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-checkpoint/kafka-$version/libs}"
if [ -f "$libs/.complete" ]; then
  echo "Apache Kafka $version present: $libs"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: mvn is missing and installing it needs root. Run as root: apt-get update && apt-get install -y maven" >&2
    exit 1
  fi
  echo "installing maven (apt-get)"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y maven
fi
echo "fetching Apache Kafka $version (kafka_2.13 and its dependencies) into $libs"
partial="$libs.partial"
rm -rf "$partial"
mkdir -p "$partial"
if ! out=$(mvn -q -B -Dstyle.color=never dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$partial" 2>&1); then
  echo "$out" >&2
  exit 1
fi  # quiet Maven still prints terminal escape codes: shown only on failure
rm -rf "$libs"
mv "$partial" "$libs"
touch "$libs/.complete"
echo "Apache Kafka $version: $(ls "$libs" | wc -l) jars in $libs"
