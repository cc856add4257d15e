#!/usr/bin/env bash
# A one-node Slurm cluster with accounting on this machine, for tests/test_slurm.py (and CI's .ci/run).
#
#   sudo bash tests/cluster/start_slurm.sh     # as root, on Debian 12; idempotent (a second call checks and returns)
#
# Installs slurm-wlm, munge, slurmdbd and mariadb-server if missing, starts munged and MariaDB by hand
# (no systemd needed), creates the accounting database, writes /etc/slurm/slurm.conf and slurmdbd.conf for
# one node (this host: `hostname -s`, CPUs from nproc, RealMemory from /proc/meminfo minus a margin, partition
# `debug`), starts slurmdbd, slurmctld and slurmd on the loopback address, registers the cluster and waits
# until `sinfo` shows the node idle and `sacct` answers. No cgroups: proctrack/linuxproc, task/none, which
# work in a container. Exits non-zero with one line naming what did not come up (and its log file).
set -euo pipefail

CLUSTER=${SLURM_TEST_CLUSTER:-mice}
WAIT_S=${SLURM_START_TIMEOUT_S:-90}
MEM_MARGIN_MB=${SLURM_MEM_MARGIN_MB:-1024}
DB_PASS=${SLURM_DB_PASS:-mice-slurm-test}   # a loopback-only test database
LOG=/var/log/slurm
start_s=$(date +%s)

say() { echo "start_slurm: $*"; }
fail() { echo "start_slurm: error: $*" >&2; exit 1; }
running() { pgrep -x "$1" >/dev/null 2>&1; }
# wait_for SECONDS WHAT COMMAND...: retry COMMAND every second until it succeeds or SECONDS pass
wait_for() {
    local seconds=$1 what=$2; shift 2
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    fail "$what did not come up within ${seconds}s"
}

[ "$(id -u)" = 0 ] || fail "run as root (it installs packages and starts daemons)"

# --- packages -------------------------------------------------------------------------------------------
missing=()
for pkg in slurm-wlm munge slurmdbd mariadb-server; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || fail "apt-get update failed"
    apt-get install -y -q "${missing[@]}" >/dev/null || fail "apt-get install ${missing[*]} failed"
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - MEM_MARGIN_MB ))
mkdir -p "$LOG" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/munge

# --- munge ----------------------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    say "creating a munge key"
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key /run/munge && chmod 400 /etc/munge/munge.key
if ! running munged; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
fi
wait_for 10 "munge (munge -n | unmunge)" bash -c "munge -n | unmunge"

# --- MariaDB and the accounting database ----------------------------------------------------------------
if ! mysqladmin ping >/dev/null 2>&1; then
    service mariadb start >/dev/null 2>&1 || (mysqld_safe >/dev/null 2>&1 &)
    wait_for 60 "MariaDB (mysqladmin ping)" mysqladmin ping
fi
mysql -u root <<SQL || fail "could not create the accounting database slurm_acct_db"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

# --- configuration --------------------------------------------------------------------------------------
# write_conf FILE MODE: stdin to FILE if its content changed; prints "changed" if it did
write_conf() {
    local file=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then rm -f "$tmp"; return 0; fi
    install -m "$mode" -o root -g root "$tmp" "$file" && rm -f "$tmp"
    echo changed
}

dbd_changed=$(write_conf /etc/slurm/slurmdbd.conf 600 <<EOF
# written by tests/cluster/start_slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
LogFile=$LOG/slurmdbd.log
PidFile=/run/slurmdbd.pid
EOF
)
conf_changed=$(write_conf /etc/slurm/slurm.conf 644 <<EOF
# written by tests/cluster/start_slurm.sh: one node ($HOST), loopback only, no cgroups
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job that asks no memory gets its CPUs' share, not the whole node (Slurm's default)
DefMemPerCPU=$(( MEM_MB / CPUS ))
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
# scancel: SIGTERM, then SIGKILL after KillWait seconds
KillWait=10
SlurmdTimeout=300
InactiveLimit=0
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)

# stop_daemon NAME PIDFILE: end a daemon started from an older configuration (by its pid file)
stop_daemon() {
    local name=$1 pidfile=$2 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ]; then
        say "restarting $name (its configuration changed)"
        kill "$pid"
        for _ in $(seq 20); do [ -d /proc/"$pid" ] || break; sleep 0.5; done
    fi
}
if [ -n "$dbd_changed" ]; then stop_daemon slurmdbd /run/slurmdbd.pid; fi
if [ -n "$conf_changed" ]; then stop_daemon slurmctld /run/slurmctld.pid; stop_daemon slurmd /run/slurmd.pid; fi

# --- daemons --------------------------------------------------------------------------------------------
if ! running slurmdbd; then
    slurmdbd || fail "slurmdbd did not start (see $LOG/slurmdbd.log)"
fi
wait_for "$WAIT_S" "slurmdbd (sacctmgr list cluster; log: $LOG/slurmdbd.log)" sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr could not add cluster $CLUSTER"
fi
if ! running slurmctld; then
    slurmctld || fail "slurmctld did not start (see $LOG/slurmctld.log)"
fi
wait_for "$WAIT_S" "slurmctld (scontrol ping; log: $LOG/slurmctld.log)" bash -c "scontrol ping | grep -q UP"
if ! running slurmd; then
    slurmd || fail "slurmd did not start (see $LOG/slurmd.log)"
fi

# --- ready? ---------------------------------------------------------------------------------------------
node_ready() {
    local state
    state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1)
    case "$state" in
        idle|mixed|allocated|completing) return 0 ;;
        down*|drain*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true; return 1 ;;
        *) return 1 ;;
    esac
}
for _ in $(seq "$WAIT_S"); do node_ready && break; sleep 1; done
node_ready || fail "node $HOST is not idle within ${WAIT_S}s (sinfo state: $(sinfo -h -n "$HOST" -o %T 2>/dev/null || echo none); see $LOG/slurmd.log and slurmctld.log)"
wait_for "$WAIT_S" "sacct (accounting through slurmdbd; log: $LOG/slurmdbd.log)" sacct -n -X -S now-1hours
say "Slurm cluster $CLUSTER ready in $(( $(date +%s) - start_s ))s: $(sinfo -h -o '%P %D node(s) %T, %c CPUs, %m MB')"
