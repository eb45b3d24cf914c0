#!/usr/bin/env bash
# Creates (once) the virtualenv and installs the project into it. Dependencies are installed
# again only when pyproject.toml changes; the project itself is re-linked every time so the
# venv always runs the checkout this script was called from.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PVM_VENV:-$HOME/.cache/pvm/venv}"
PYTHON="${PYTHON:-python3}"

if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing a Java runtime for Spark" >&2
  apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi
# Debian's JDBC drivers: `pvm bench load` compares with Spark reading the sources over JDBC
jdbc=()
[ -f /usr/share/java/postgresql.jar ] || jdbc+=(libpostgresql-jdbc-java)
[ -f /usr/share/java/mariadb-java-client.jar ] || jdbc+=(libmariadb-java)
[ -f /usr/share/java/sqlite-jdbc.jar ] || jdbc+=(libxerial-sqlite-jdbc-java)
if ((${#jdbc[@]})); then
  echo "setup: installing JDBC drivers ${jdbc[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${jdbc[@]}" >/dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
stamp="$VENV/.pvm-deps-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing dependencies (the first time downloads PySpark, ~450 MB)" >&2
  "$VENV/bin/pip" install -q -e '.[test]'
  rm -f "$VENV"/.pvm-deps-* && touch "$stamp"
else
  "$VENV/bin/pip" install -q --no-deps -e . >/dev/null
fi
# Spark's classes archived once for this PySpark and Java (a minute the first time): every
# Spark JVM of the service then starts in about half the time (warehouse/store/spark_classes.py)
"$VENV/bin/python" -m warehouse.store.spark_classes
