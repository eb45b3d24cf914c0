#!/usr/bin/env bash
# Makes sure the PostgreSQL and MariaDB servers the integration tests use are running on
# 127.0.0.1 (5432 and 3306) with what log-based capture needs, and waits until both answer:
# - PostgreSQL: wal_level = logical (logical decoding with pgoutput), and autovacuum on
#   (PostgreSQL's default, which a server may have turned off: trigger capture's outbox is a
#   queue table, every captured row inserted and then deleted, and a source's tables under
#   a steady write load bloat without it; a reload, no restart);
# - MariaDB: the binary log on, binlog_format = ROW, binlog_row_image = FULL,
#   binlog_row_metadata = FULL (row events with column names and both images).
# A server whose settings differ is reconfigured and restarted; one already set up is left
# alone, so running this twice changes nothing.
set -euo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
maria_up() { mariadb-admin --host=127.0.0.1 --port=3306 --user=root ping >/dev/null 2>&1 || mysqladmin --host=127.0.0.1 --port=3306 --user=root ping >/dev/null 2>&1; }
maria_sql() { mariadb --host=127.0.0.1 --port=3306 --user=root -N -B -e "$1"; }
pg_sql() { psql -h 127.0.0.1 -U postgres -d postgres -Atqc "$1"; }
pg_cluster() { ls /etc/postgresql | head -n1; }
pg_autovacuum_on() { [ "$(pg_sql 'SHOW autovacuum')" = "on" ]; }

wait_for() {
  local check=$1
  for _ in $(seq 1 60); do
    if $check; then return 0; fi
    sleep 1
  done
  return 1
}

start_pg() { pg_ctlcluster --skip-systemctl-redirect "$(pg_cluster)" main start || true; }
start_maria() { start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true; }

if ! pg_up; then
  echo "services: starting PostgreSQL" >&2
  start_pg
fi
if ! maria_up; then
  echo "services: starting MariaDB" >&2
  start_maria
fi
wait_for pg_up || { echo "services: PostgreSQL is not answering on 127.0.0.1:5432" >&2; exit 1; }
wait_for maria_up || { echo "services: MariaDB is not answering on 127.0.0.1:3306" >&2; exit 1; }

# PostgreSQL: autovacuum.
if ! pg_autovacuum_on; then
  echo "services: PostgreSQL: turning autovacuum on" >&2
  pg_sql "ALTER SYSTEM SET autovacuum = on"
  pg_sql "SELECT pg_reload_conf()" >/dev/null
  wait_for pg_autovacuum_on || { echo "services: PostgreSQL still has autovacuum $(pg_sql 'SHOW autovacuum')" >&2; exit 1; }
fi

# PostgreSQL: logical decoding.
if [ "$(pg_sql 'SHOW wal_level')" != "logical" ]; then
  echo "services: PostgreSQL: setting wal_level = logical and restarting" >&2
  pg_sql "ALTER SYSTEM SET wal_level = 'logical'"
  pg_ctlcluster --skip-systemctl-redirect "$(pg_cluster)" main restart
  wait_for pg_up || { echo "services: PostgreSQL did not come back after the restart" >&2; exit 1; }
  [ "$(pg_sql 'SHOW wal_level')" = "logical" ] || { echo "services: PostgreSQL still has wal_level $(pg_sql 'SHOW wal_level')" >&2; exit 1; }
fi

# MariaDB: the binary log in ROW format with full images and metadata.
wanted_binlog="1 ROW FULL FULL"
binlog_settings() { maria_sql "SELECT CONCAT_WS(' ', @@log_bin + 0, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata)"; }
if [ "$(binlog_settings)" != "$wanted_binlog" ]; then
  echo "services: MariaDB: turning on the ROW binary log and restarting" >&2
  mkdir -p /etc/mysql/conf.d
  cat >/etc/mysql/conf.d/pvm-binlog.cnf <<'EOF'
# Written by the project's scripts/services.sh: what log-based capture needs.
[mysqld]
server_id = 1
log_bin = mysql-bin
binlog_format = ROW
binlog_row_image = FULL
binlog_row_metadata = FULL
expire_logs_days = 2
EOF
  grep -q '^!includedir /etc/mysql/conf.d' /etc/mysql/my.cnf || printf '\n!includedir /etc/mysql/conf.d/\n' >>/etc/mysql/my.cnf
  mariadb-admin --host=127.0.0.1 --port=3306 --user=root shutdown || mysqladmin --host=127.0.0.1 --port=3306 --user=root shutdown
  for _ in $(seq 1 60); do pgrep -x mariadbd >/dev/null || break; sleep 1; done
  start_maria
  wait_for maria_up || { echo "services: MariaDB did not come back after the restart" >&2; exit 1; }
  [ "$(binlog_settings)" = "$wanted_binlog" ] || { echo "services: MariaDB binlog settings are $(binlog_settings), wanted $wanted_binlog" >&2; exit 1; }
fi
