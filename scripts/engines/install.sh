#!/usr/bin/env bash
# Installs what the Flink and Spark engines need, pinned, outside the project's venv, under
# $TFRECORD_ENGINES_HOME (default ~/.cache/tfrecord-engines):
#   flink-<v>/pyflink   FLINK_HOME: the apache-flink + apache-flink-libraries wheels (--no-deps:
#                       apache-flink pins an old apache-beam, which must not reach the venv)
#   spark-<v>/pyspark   SPARK_HOME: the pyspark package (bin/spark-class), Scala 2.12
#   job-servers/        Beam's Flink and Spark job servers, assembled with Maven from Beam's
#                       runner artifacts: lib/*.jar plus a jar whose manifest names them;
#                       for Flink also session-job-server.jar (scripts/engines/java/), which
#                       a local cluster's kept job server runs
# Idempotent: a stamp per part; a second run takes a second. Needs java (17) and mvn.
# Usage: bash scripts/engines/install.sh [flink|spark|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/../.."
what="${1:-all}"
eval "$(python3 beam_pipelines/engines/versions.py)"
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PYTHON="${PYTHON_FOR_PIP:-.venv/bin/python}"
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (Java 17 and Maven are needed)" >&2; exit 2; }
done
mkdir -p "$ENGINES_HOME"

# pip_target NAME DIR SPEC...: installs SPEC (exact pins) into DIR, once.
pip_target() {
  local name="$1" dir="$2"; shift 2
  local stamp="$dir/.installed-$(echo "$*" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  echo "Installing $* into $dir ..."
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  "$PYTHON" -m pip install --quiet --no-deps --no-compile --target "$dir.tmp" "$@"
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/$(basename "$stamp")"
  echo "$name installed in $dir"
}

# job_server NAME MAIN_CLASS JAR DEPENDENCIES_XML: resolves the dependencies with Maven into
# lib/ beside JAR, and writes JAR: a manifest-only jar (Main-Class, Class-Path lib/...), which
# Beam's --*_job_server_jar runs with java -jar.
job_server() {
  local name="$1" main="$2" jar="$3" deps="$4"
  local dir; dir="$(dirname "$jar")"
  local stamp="$dir/.installed-$(echo "$main $deps" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && [ -f "$jar" ] && return 0
  echo "Assembling the $name job server in $dir (Maven) ..."
  local build="$dir.build"
  rm -rf "$build" && mkdir -p "$build/lib"
  cat >"$build/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tfrecord</groupId><artifactId>$name-job-server</artifactId><version>1</version>
  <dependencies>$deps
    <dependency><groupId>org.slf4j</groupId><artifactId>jcl-over-slf4j</artifactId><version>$SLF4J_VERSION</version></dependency>
  </dependencies>
</project>
POM
  (cd "$build" && mvn -B -q dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory=lib -Dmdep.useRepositoryLayout=false)
  mkdir -p "$build/manifest"
  {
    echo "Manifest-Version: 1.0"
    echo "Main-Class: $main"
    # Manifest lines are at most 72 bytes; continuation lines start with one space.
    (cd "$build" && ls lib/*.jar | sort | tr '\n' ' ') | sed 's/^/Class-Path: /' | fold -w 70 | sed '2,$s/^/ /'
    echo
  } >"$build/manifest/MANIFEST.MF"
  (cd "$build" && jar --create --file "$(basename "$jar")" --manifest manifest/MANIFEST.MF)
  rm -rf "$dir" && mkdir -p "$dir" && mv "$build/lib" "$build/$(basename "$jar")" "$build/pom.xml" "$dir/"
  rm -rf "$build" && touch "$stamp"
  echo "$name job server: $jar"
}

# session_job_server JOB_SERVER_JAR: compiles scripts/engines/java/*.java (the Flink job server
# a local cluster keeps, staging no jars with its jobs) against that job server's classpath into
# session-job-server.jar beside it. Needs javac; without it the cluster runs Beam's own driver.
session_job_server() {
  local jar="$1" dir; dir="$(dirname "$1")"
  local out="$dir/session-job-server.jar" src="scripts/engines/java"
  local stamp="$dir/.session-$(cat "$src"/*.java | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && [ -f "$out" ] && return 0
  command -v javac >/dev/null || { echo "javac not found: the local Flink cluster's job server ships its classpath with every job"; return 0; }
  local build; build="$(mktemp -d)"
  javac -proc:none --release 17 -cp "$jar" -d "$build" "$src"/*.java
  (cd "$build" && jar --create --file "$out" .)
  rm -rf "$build" "$dir"/.session-* && touch "$stamp"
  echo "session job server: $out"
}

beam_dep() {  # beam_dep ARTIFACT VERSION [EXCLUSIONS_XML]
  echo "<dependency><groupId>org.apache.beam</groupId><artifactId>$1</artifactId><version>$2</version><exclusions>${3:-}</exclusions></dependency>"
}
# Served at no Beam version near 2.77 but 2.65.0; the runners' own pins win for its dependencies.
no_job_service="<exclusion><groupId>org.apache.beam</groupId><artifactId>beam-runners-java-job-service</artifactId></exclusion>"
job_service="$(beam_dep beam-runners-java-job-service "$BEAM_JOB_SERVICE_VERSION")"

if [ "$what" = all ] || [ "$what" = flink ]; then
  pip_target "Flink $FLINK_VERSION" "$(dirname "$FLINK_HOME_DIR")" \
    "apache-flink==$FLINK_VERSION" "apache-flink-libraries==$FLINK_VERSION"
  flink_deps="$(beam_dep "beam-runners-flink-$FLINK_MINOR" "$BEAM_RUNNER_VERSION" "$no_job_service")$job_service"
  for a in flink-clients flink-streaming-java flink-core flink-java flink-runtime flink-metrics-core; do
    flink_deps="$flink_deps<dependency><groupId>org.apache.flink</groupId><artifactId>$a</artifactId><version>$FLINK_VERSION</version></dependency>"
  done
  flink_deps="$flink_deps<dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>"
  job_server "flink-$FLINK_MINOR" org.apache.beam.runners.flink.FlinkJobServerDriver \
    "$FLINK_JOB_SERVER_JAR" "$flink_deps"
  session_job_server "$FLINK_JOB_SERVER_JAR"
fi

if [ "$what" = all ] || [ "$what" = spark ]; then
  pip_target "Spark $SPARK_VERSION" "$(dirname "$SPARK_HOME_DIR")" "pyspark==$SPARK_VERSION"
  spark_deps="$(beam_dep beam-runners-spark-3 "$BEAM_RUNNER_VERSION" "$no_job_service")$job_service"
  # Provided-scope in Beam's runner: the job server brings Spark itself, at the cluster's release.
  for a in spark-core spark-network-common spark-sql spark-streaming spark-catalyst; do
    spark_deps="$spark_deps<dependency><groupId>org.apache.spark</groupId><artifactId>${a}_$SPARK_SCALA</artifactId><version>$SPARK_VERSION</version></dependency>"
  done
  spark_deps="$spark_deps<dependency><groupId>com.thoughtworks.paranamer</groupId><artifactId>paranamer</artifactId><version>2.8</version></dependency>"
  job_server spark-3 org.apache.beam.runners.spark.SparkJobServerDriver \
    "$SPARK_JOB_SERVER_JAR" "$spark_deps"
fi
echo "engines installed in $ENGINES_HOME"
