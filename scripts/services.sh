#!/usr/bin/env bash
# Makes sure the PostgreSQL and MariaDB servers the integration tests use are running on
# 127.0.0.1 (5432 and 3306), starting whichever is not, and waits until both answer.
set -euo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
maria_up() { mariadb-admin --host=127.0.0.1 --port=3306 --user=root ping >/dev/null 2>&1 || mysqladmin --host=127.0.0.1 --port=3306 --user=root ping >/dev/null 2>&1; }

if ! pg_up; then
  echo "services: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
if ! maria_up; then
  echo "services: starting MariaDB" >&2
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
for _ in $(seq 1 60); do
  if pg_up && maria_up; then exit 0; fi
  sleep 1
done
pg_up || echo "services: PostgreSQL is not answering on 127.0.0.1:5432" >&2
maria_up || echo "services: MariaDB is not answering on 127.0.0.1:3306" >&2
exit 1
