#!/usr/bin/env bash
# A Spark standalone cluster from the pip-installed PySpark, which ships bin/spark-class but
# not Spark's sbin/start-master.sh and friends.
#
#   spark-cluster.sh start    a master and N workers on this machine, in the background
#   spark-cluster.sh stop     stop them (and the executors they started)
#   spark-cluster.sh status   which of them run; exit 0 if all do, 3 otherwise
#   spark-cluster.sh master   run the master in the foreground (a systemd unit's ExecStart)
#   spark-cluster.sh worker   run one worker in the foreground, for --master-url
#
# Options (each also as an environment variable, for an EnvironmentFile):
#   --host HOST             address the master and workers bind to   SPARK_CLUSTER_HOST (127.0.0.1)
#   --master-port PORT      the master's port                        SPARK_MASTER_PORT (7077)
#   --master-webui-port P   the master's web UI (and /json status)   SPARK_MASTER_WEBUI_PORT (8080)
#   --master-url URL        the master a worker joins                SPARK_MASTER_URL (spark://HOST:PORT)
#   --workers N             workers that `start` runs                SPARK_CLUSTER_WORKERS (1)
#   --worker-cores N        cores each worker offers                 SPARK_WORKER_CORES (all)
#   --worker-memory SIZE    memory each worker offers (e.g. 2g)      SPARK_WORKER_MEMORY (1g)
#   --worker-webui-port P   first worker's web UI, the next get P+1… SPARK_WORKER_WEBUI_PORT (8081)
#   --run-dir DIR           logs (*.log), pid files (*.pid), the     SPARK_CLUSTER_DIR (./spark-cluster)
#                           workers' work directories (work-N/)
#   --python PATH           the Python whose PySpark is used, and    PVM_PYTHON (python3)
#                           that executors run
#   --timeout SECONDS       how long `start` waits for the master    SPARK_CLUSTER_TIMEOUT (60)
#                           and the workers to be up, `stop` for them to end
#   --auth-secret-file F    Spark's shared secret: the first line   SPARK_AUTH_SECRET_FILE
#                           of F (or the secret itself in $SPARK_AUTH_SECRET); the master,
#                           the workers and every application then authenticate with it
#                           (spark.authenticate). Without one, none does.
#
# The secret goes to the daemons in RUN_DIR/daemon.properties (mode 0600, --properties-file),
# never on a command line, which every user of the machine can read (ps).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "spark-cluster: $*" >&2; exit 1; }

command=${1:-}
[[ -n $command ]] || usage
shift
host=${SPARK_CLUSTER_HOST:-127.0.0.1}
master_port=${SPARK_MASTER_PORT:-7077}
master_webui_port=${SPARK_MASTER_WEBUI_PORT:-8080}
master_url=${SPARK_MASTER_URL:-}
workers=${SPARK_CLUSTER_WORKERS:-1}
worker_cores=${SPARK_WORKER_CORES:-}
worker_memory=${SPARK_WORKER_MEMORY:-1g}
worker_webui_port=${SPARK_WORKER_WEBUI_PORT:-8081}
run_dir=${SPARK_CLUSTER_DIR:-./spark-cluster}
python=${PVM_PYTHON:-python3}
timeout=${SPARK_CLUSTER_TIMEOUT:-60}
auth_secret_file=${SPARK_AUTH_SECRET_FILE:-}
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --host) host=$2 ;;
    --master-port) master_port=$2 ;;
    --master-webui-port) master_webui_port=$2 ;;
    --master-url) master_url=$2 ;;
    --workers) workers=$2 ;;
    --worker-cores) worker_cores=$2 ;;
    --worker-memory) worker_memory=$2 ;;
    --worker-webui-port) worker_webui_port=$2 ;;
    --run-dir) run_dir=$2 ;;
    --python) python=$2 ;;
    --timeout) timeout=$2 ;;
    --auth-secret-file) auth_secret_file=$2 ;;
    *) die "unknown option $1 (see $0 without arguments)" ;;
  esac
  shift 2
done
for number in "$master_port" "$master_webui_port" "$workers" "$worker_webui_port" "$timeout"; do
  [[ $number =~ ^[0-9]+$ ]] || die "not a number: '$number'"
done
master_url=${master_url:-spark://$host:$master_port}

spark_home() {
  local home
  home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null) ||
    die "$python cannot import pyspark (give --python or PVM_PYTHON)"
  [[ -x $home/bin/spark-class ]] || die "$home/bin/spark-class is missing"
  echo "$home"
}

spark_environment() {
  # The environment of the daemons: where Spark is, which Python executors run, and no
  # address lookup of the machine's hostname (the daemons bind to --host).
  SPARK_HOME=${SPARK_HOME:-$(spark_home)} || exit 1
  export SPARK_HOME
  export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v "$python")}
  export SPARK_LOCAL_IP=$host
  # spark-class reads conf/spark-env.sh and the like from here; nothing is needed from it
  export SPARK_CONF_DIR=${SPARK_CONF_DIR:-$SPARK_HOME/conf}
  # the class archive of the service's setup, where this Python has the service installed
  # (warehouse/store/spark_classes.py): the daemons start sooner
  local archived
  archived=$("$python" -c 'from warehouse.store.spark_classes import java_options; print(java_options())' 2>/dev/null) ||
    archived=""
  [[ -z $archived ]] || export SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:-} $archived"
}

auth_secret() { # the shared secret, from --auth-secret-file or $SPARK_AUTH_SECRET; empty if none
  local secret=${SPARK_AUTH_SECRET:-}
  if [[ -n $auth_secret_file ]]; then
    [[ -r $auth_secret_file ]] || die "--auth-secret-file $auth_secret_file: cannot read it"
    IFS= read -r secret <"$auth_secret_file" || true
    [[ -n $secret ]] || die "--auth-secret-file $auth_secret_file: its first line is empty"
  fi
  # a Java properties value: no backslash, space or line break to escape
  [[ -z $secret || $secret =~ ^[A-Za-z0-9._~+/=:@%-]+$ ]] ||
    die "the Spark secret may hold letters, digits and ._~+/=:@%- only"
  echo "$secret"
}

properties=() # the daemons' --properties-file (write_properties)
write_properties() { # RUN_DIR/daemon.properties, 0600: the secret if any, no REST submission server
  local secret file
  secret=$(auth_secret) || exit 1
  mkdir -p "$run_dir"
  file=$(cd "$run_dir" && pwd)/daemon.properties
  (
    umask 077
    rm -f "$file"
    {
      # the master's REST server (port 6066) would take applications without any secret
      echo spark.master.rest.enabled=false
      [[ -z $secret ]] || printf 'spark.authenticate=true\nspark.authenticate.secret=%s\n' "$secret"
    } >"$file"
  )
  properties=(--properties-file "$file")
}

master_command() {
  echo "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host "$host" --port "$master_port" --webui-port "$master_webui_port" "${properties[@]}"
}

worker_args() { # $1: the worker's number, from 1
  local args=(--host "$host" --webui-port $((worker_webui_port + $1 - 1)) --memory "$worker_memory"
    --work-dir "$run_dir/work-$1")
  [[ -z $worker_cores ]] || args+=(--cores "$worker_cores")
  echo "${args[@]}" "${properties[@]}"
}

running() { # $1: a pid file; true if its process runs
  local pid
  [[ -f $1 ]] && pid=$(<"$1") && [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

wait_for_port() { # $1 host, $2 port, $3 the pid file of the process that should listen
  local deadline=$((SECONDS + timeout))
  until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
    running "$3" || die "$(basename "$3" .pid) ended before listening on $1:$2; see ${3%.pid}.log"
    ((SECONDS < deadline)) || die "nothing listens on $1:$2 after ${timeout}s; see ${3%.pid}.log"
    sleep 0.5
  done
}

alive_workers() { # the master's count of alive workers, from its web UI's JSON
  "$python" - "$host" "$master_webui_port" <<'EOF' 2>/dev/null || echo 0
import json, sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/json/", timeout=5) as answer:
    print(json.load(answer).get("aliveworkers", 0))
EOF
}

launch() { # $1 name; the rest: the command. Own session (process group), log and pid file.
  local name=$1
  shift
  if running "$run_dir/$name.pid"; then
    echo "spark-cluster: $name already runs (pid $(<"$run_dir/$name.pid"))" >&2
    return
  fi
  # setsid: the daemon and the executors it starts form one process group, which stop ends
  setsid "$@" >>"$run_dir/$name.log" 2>&1 </dev/null &
  echo $! >"$run_dir/$name.pid"
}

stop_one() { # $1 name
  local pidfile=$run_dir/$1.pid pid deadline
  if running "$pidfile"; then
    pid=$(<"$pidfile")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while kill -0 -- "-$pid" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        echo "spark-cluster: $1 (pid $pid) did not stop in ${timeout}s: killed" >&2
        kill -KILL -- "-$pid" 2>/dev/null || true
        break
      fi
      sleep 0.2
    done
  fi
  rm -f "$pidfile"
}

stop_all() {
  local name
  for name in $(names); do stop_one "$name"; done
}

names() { # the daemons of this run directory, workers first
  local name
  for name in "$run_dir"/worker-*.pid; do [[ -e $name ]] && basename "$name" .pid; done
  echo master
}

case $command in
  master | worker | start)
    spark_environment
    write_properties
    ;;
esac

case $command in
  master)
    # shellcheck disable=SC2046
    exec $(master_command)
    ;;
  worker)
    mkdir -p "$run_dir/work-1"
    # shellcheck disable=SC2046
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker $(worker_args 1) "$master_url"
    ;;
  start)
    mkdir -p "$run_dir"
    run_dir=$(cd "$run_dir" && pwd)
    # a start that fails stops what it started: nothing is left running half configured
    trap 'if (($? != 0)); then stop_all; fi' EXIT
    # shellcheck disable=SC2046
    launch master $(master_command)
    wait_for_port "$host" "$master_port" "$run_dir/master.pid"
    for ((i = 1; i <= workers; i++)); do
      mkdir -p "$run_dir/work-$i"
      # shellcheck disable=SC2046
      launch "worker-$i" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
        $(worker_args "$i") "$master_url"
    done
    deadline=$((SECONDS + timeout))
    until (($(alive_workers) >= workers)); do
      for ((i = 1; i <= workers; i++)); do
        running "$run_dir/worker-$i.pid" || die "worker-$i ended; see $run_dir/worker-$i.log"
      done
      ((SECONDS < deadline)) || die "$workers workers did not register in ${timeout}s; see $run_dir/worker-*.log"
      sleep 0.5
    done
    trap - EXIT
    echo "spark-cluster: $master_url with $workers workers (logs and pids in $run_dir)"
    ;;
  stop)
    [[ -d $run_dir ]] || exit 0
    stop_all
    rm -f "$run_dir/daemon.properties"
    ;;
  status)
    status=0
    [[ -d $run_dir ]] || { echo "master: stopped"; exit 3; }
    for name in $(names); do
      if running "$run_dir/$name.pid"; then
        echo "$name: running (pid $(<"$run_dir/$name.pid"))"
      else
        echo "$name: stopped"
        status=3
      fi
    done
    exit $status
    ;;
  *) usage ;;
esac
