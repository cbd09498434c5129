# scripts/stack-cluster.sh — `scripts/stack --cluster`: three RabbitMQ nodes
# and three MariaDB Galera nodes on 127.0.0.1, as plain processes, for trying
# the worker against clusters on one machine.  Sourced by scripts/stack (its
# helpers and per-node functions are reused by pointing their globals at one
# node at a time); never run on its own.
#
#   scripts/stack up --cluster [--keep]   start and form both clusters; ready when every
#                                         RabbitMQ node sees 3 running nodes and every
#                                         Galera node is Synced in a cluster of size 3
#   scripts/stack down --cluster [--keep] stop what up started (pid files), remove state
#   scripts/stack status --cluster        per node; exit 0 all up, 3 none, 1 partial
#   scripts/stack env --cluster           export lines: the *_URL variables list the three
#                                         nodes (comma-separated), plus one URL per node
#                                         (fails the eval when no node of ours runs)
#   scripts/stack ctl --cluster [--node N] ARGS   rabbitmqctl on node N (default: the first up)
#   scripts/stack sql --cluster [--node N] ARGS   mariadb as root on node N, db `inbox`
#   scripts/stack {stop,start,kill,restart}-{db,mq} --cluster --node N
#   scripts/stack leader --cluster [QUEUE]        the node (1-3) leading a quorum queue
#                                         (default orders.inbox)
#   scripts/stack logs --cluster          the log files
#
# Environment (all optional): INBOX_CLUSTER_DIR (<repo>/.cluster),
# INBOX_CLUSTER_AMQP_PORT (5690: nodes 5690-5692), INBOX_CLUSTER_DIST_PORT
# (25690), INBOX_CLUSTER_EPMD_PORT (4390, one private epmd for the three),
# INBOX_CLUSTER_DB_PORT (3320), INBOX_CLUSTER_GALERA_PORT (4560: node i uses
# base+10(i-1) for group communication, +1 for IST, +2 for the rsync SST),
# INBOX_CLUSTER_NODENAME (inboxc: inboxc1@localhost ...), and the readiness
# bounds INBOX_STACK_DB_TIMEOUT / INBOX_STACK_MQ_TIMEOUT.
#
# Sized for a small shared machine: a 32 MiB buffer pool and a 16 MiB
# gcache per Galera node, schedulers that do not spin when idle.

CL_DIR="$(realpath -m "${INBOX_CLUSTER_DIR:-$ROOT/.cluster}")"
CL_AMQP_PORT="${INBOX_CLUSTER_AMQP_PORT:-5690}"
CL_DIST_PORT="${INBOX_CLUSTER_DIST_PORT:-25690}"
CL_EPMD_PORT="${INBOX_CLUSTER_EPMD_PORT:-4390}"
CL_DB_PORT="${INBOX_CLUSTER_DB_PORT:-3320}"
CL_GALERA_PORT="${INBOX_CLUSTER_GALERA_PORT:-4560}"
CL_NODEPREFIX="${INBOX_CLUSTER_NODENAME:-inboxc}"
CL_N=3
GALERA_PROVIDER=/usr/lib/galera/libgalera_smm.so

# Galera runs as mysql: run as root, the joiner's rsync daemon drops its
# privileges and cannot write a root-owned data folder (NOTES.md).
cl_db_user() { if is_root; then echo mysql; else id -un; fi; }

# Node i's folder: $CL_DIR/db$i, or the folder that symlink points to
# (cl_prepare_db_dir).  Resolved, because mariadbd and the rsync of a state
# transfer run as mysql and open these paths themselves.
cl_db_dir() {
    local link="$CL_DIR/db$1"
    if [ -L "$link" ]; then readlink -f "$link"; else printf '%s' "$link"; fi
}

# Point scripts/stack's per-node globals at node $1 (1-3).
cl_db_node() {
    local i="$1"
    DB_DIR="$(cl_db_dir "$i")"
    DB_PORT=$((CL_DB_PORT + i - 1))
    DB_DATA="$DB_DIR/data"
    DB_PIDFILE="$DB_DIR/mariadbd.pid"
    DB_LOG="$DB_DIR/mariadbd.log"
    DB_SOCK="$DB_DIR/mariadbd.sock"
    if [ "${#DB_SOCK}" -gt 100 ]; then
        DB_SOCK="${TMPDIR:-/tmp}/inbox-cluster-$(printf '%s' "$CL_DIR" | md5sum | cut -c1-12)-$i.sock"
    fi
    CL_GPORT=$((CL_GALERA_PORT + 10 * (i - 1)))
}

cl_mq_node() {
    local i="$1"
    AMQP_PORT=$((CL_AMQP_PORT + i - 1))
    DIST_PORT=$((CL_DIST_PORT + i - 1))
    NODE="$CL_NODEPREFIX$i@localhost"
    MQ_LINK="$CL_DIR/mq$i"
}

cl_globals() {
    PORT_SETTING=INBOX_CLUSTER_
    EPMD_PORT="$CL_EPMD_PORT"
    EPMD_DIR="$CL_DIR/epmd"
    EPMD_PIDFILE="$EPMD_DIR/epmd.pid"
    TLS=0
    TLS_DIR="$CL_DIR/no-tls"
    # Idle Erlang schedulers spin by default; three brokers on two shared
    # cores would burn a core doing nothing.
    MQ_ERL_EXTRA="+sbwt none +sbwtdcpu none +sbwtdio none"
    STACK_DIR="$CL_DIR"
}

cl_gcomm() {
    local i list=""
    for i in $(seq 1 "$CL_N"); do
        list="$list${list:+,}127.0.0.1:$((CL_GALERA_PORT + 10 * (i - 1)))"
    done
    printf 'gcomm://%s' "$list"
}

# ---------------------------------------------------------------- Galera

cl_db_status_var() {  # var -> value on the current node, empty when unreachable
    db_sql_root -N -B --connect-timeout=2 -e "SHOW GLOBAL STATUS LIKE '$1'" 2>/dev/null | cut -f2
}

cl_db_synced() {
    [ "$(cl_db_status_var wsrep_local_state_comment)" = Synced ] &&
        [ "$(cl_db_status_var wsrep_cluster_size)" = "$CL_N" ]
}

# Node i's folder, writable by the user Galera runs as.  Run as root, that
# is mysql, which cannot reach a checkout under a closed folder (a clone in
# root's home, mode 700): then the node's state lives in a folder of its
# own under ${TMPDIR:-/tmp}, linked from $CL_DIR/db$i (as prepare_mq_dir
# does for RabbitMQ), and `down` removes both.
cl_prepare_db_dir() {
    local i="$1" user link alt
    link="$CL_DIR/db$i"
    user="$(cl_db_user)"
    [ -L "$link" ] && [ ! -e "$link" ] && rm -f "$link"   # its folder was removed (a /tmp cleaned)
    [ -e "$link" ] || mkdir -p "$link"
    if is_root; then
        chown "$user:$user" "$(cl_db_dir "$i")"
        if ! setpriv --reuid="$user" --regid="$user" --init-groups -- test -w "$(cl_db_dir "$i")"; then
            [ -L "$link" ] && die "the $user user cannot write $(cl_db_dir "$i") (Galera node $i's state); fix its parents' modes or set INBOX_CLUSTER_DIR to a folder $user can reach"
            alt="$(mktemp -d "${TMPDIR:-/tmp}/inbox-cluster-db$i.XXXXXX")"
            chmod 755 "$alt"
            chown "$user:$user" "$alt"
            if ! setpriv --reuid="$user" --regid="$user" --init-groups -- test -w "$alt"; then
                rm -rf "$alt"
                die "the $user user can reach neither $CL_DIR nor ${TMPDIR:-/tmp} (Galera node $i's state): make every parent of one of them searchable by others (chmod o+x), or set INBOX_CLUSTER_DIR (or TMPDIR) to a folder $user can reach"
            fi
            rm -rf "$link"
            ln -s "$alt" "$link"
            log "$user cannot reach $CL_DIR; Galera node $i keeps its state in $alt"
        fi
    fi
    cl_db_node "$i"
}

# Start Galera node i; $2 = 1 bootstraps a new cluster from it.  Returns
# once the process runs; readiness is cl_db_wait's.
cl_start_db() {
    local i="$1" bootstrap="${2:-0}" user
    cl_db_node "$i"
    user="$(cl_db_user)"
    if db_running; then return 0; fi
    check_port_free "$DB_PORT" "MariaDB node $i" DB
    cl_prepare_db_dir "$i"
    if [ "$i" = 1 ] && [ ! -d "$DB_DATA/mysql" ]; then
        log "initialising Galera node 1 in $DB_DATA"
        rm -rf "$DB_DATA"
        if ! mariadb-install-db --no-defaults --user="$user" --datadir="$DB_DATA" \
                --auth-root-authentication-method=normal --skip-test-db \
                >"$DB_DIR/install-db.log" 2>&1; then
            tail_log "$DB_DIR/install-db.log"
            die "mariadb-install-db failed for Galera node 1 (log: $DB_DIR/install-db.log)"
        fi
    fi
    # The others start empty and get node 1's data by state transfer.
    mkdir -p "$DB_DATA"
    if [ "$bootstrap" = 1 ] && [ -f "$DB_DATA/grastate.dat" ]; then
        # --keep of a cluster stopped whole: this node bootstraps it again
        sed -i 's/^safe_to_bootstrap:.*/safe_to_bootstrap: 1/' "$DB_DATA/grastate.dat"
    fi
    is_root && chown -R "$user:$user" "$DB_DIR"
    rm -f "$DB_SOCK" "$DB_PIDFILE"
    local extra=()
    [ "$bootstrap" = 1 ] && extra+=(--wsrep-new-cluster)
    setsid mariadbd --no-defaults --user="$user" "${extra[@]}" \
        --datadir="$DB_DATA" --socket="$DB_SOCK" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$DB_PIDFILE" --log-error="$DB_LOG" \
        --max-connections=300 --skip-name-resolve \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
        --performance-schema=OFF --innodb-buffer-pool-size=32M --innodb-log-file-size=48M \
        --binlog-format=ROW --innodb-autoinc-lock-mode=2 --default-storage-engine=InnoDB \
        --wsrep-on=ON --wsrep-provider="$GALERA_PROVIDER" \
        --wsrep-cluster-name=inbox-cluster --wsrep-cluster-address="$(cl_gcomm)" \
        --wsrep-node-name="db$i" --wsrep-node-address=127.0.0.1 \
        --wsrep-node-incoming-address="127.0.0.1:$DB_PORT" \
        --wsrep-provider-options="base_port=$CL_GPORT;gmcast.listen_addr=tcp://127.0.0.1:$CL_GPORT;ist.recv_addr=127.0.0.1:$((CL_GPORT + 1));gcache.size=16M;gcache.page_size=16M" \
        --wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:$((CL_GPORT + 2))" \
        --wsrep-slave-threads=2 \
        >"$DB_DIR/mariadbd.out" 2>&1 </dev/null &
    echo $! >"$DB_DIR/launcher.pid"
}

# Wait until node i is Synced in a cluster of three, bounded; on failure
# name the node and its log.
cl_db_wait() {
    local i="$1" deadline=$((SECONDS + DB_TIMEOUT))
    cl_db_node "$i"
    until db_ping && cl_db_synced; do
        if ! db_running; then
            tail_log "$DB_LOG" "$DB_DIR/mariadbd.out"
            die "Galera node $i (port $DB_PORT) exited during start-up (log: $DB_LOG)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail_log "$DB_LOG"
            die "Galera node $i (port $DB_PORT) not Synced in a cluster of $CL_N within ${DB_TIMEOUT}s: state '$(cl_db_status_var wsrep_local_state_comment)', cluster size '$(cl_db_status_var wsrep_cluster_size)' (log: $DB_LOG)"
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------- RabbitMQ

cl_cookie() {
    [ -f "$CL_DIR/cookie" ] || {
        mkdir -p "$CL_DIR"
        head -c 32 /dev/urandom | md5sum | cut -c1-20 | tr -d '\n' >"$CL_DIR/cookie"
        chmod 400 "$CL_DIR/cookie"
    }
}

# Start broker node i (same cookie as the others) and wait for it.
cl_start_mq() {
    local i="$1" d
    cl_mq_node "$i"
    if mq_up; then return 0; fi
    cl_cookie
    prepare_mq_dir
    d="$(mq_dir)"
    # one Erlang cookie for the three nodes and the CLI
    chmod 600 "$d/home/.erlang.cookie" 2>/dev/null || true
    cp "$CL_DIR/cookie" "$d/home/.erlang.cookie"
    chmod 400 "$d/home/.erlang.cookie"
    is_root && chown -R rabbitmq:rabbitmq "$d"
    start_mq || die "RabbitMQ node $i ($NODE) did not start (logs: $d/log/$NODE.log $d/server.out)"
}

cl_mq_running_nodes() {  # how many nodes node $1 sees running
    cl_mq_node "$1"
    CTL_TIMEOUT=15 mqctl eval 'length(rabbit_nodes:all_running()).' 2>/dev/null | tr -dc '0-9'
}

cl_mq_join() {
    local i="$1" first="${CL_NODEPREFIX}1@localhost" d
    cl_mq_node "$i"
    d="$(mq_dir)"
    if CTL_TIMEOUT=30 mqctl cluster_status 2>/dev/null | grep -q "$first"; then return 0; fi
    { CTL_TIMEOUT=60 mqctl stop_app && CTL_TIMEOUT=60 mqctl join_cluster "$first" &&
      CTL_TIMEOUT=120 mqctl start_app; } >"$d/join.out" 2>&1 || {
        tail_log "$d/join.out" "$d/log/$NODE.log"
        die "RabbitMQ node $i ($NODE) could not join $first (logs: $d/join.out $d/log/$NODE.log)"
    }
}

cl_mq_wait() {
    local i="$1" deadline=$((SECONDS + MQ_TIMEOUT)) n d
    cl_mq_node "$i"; d="$(mq_dir)"
    until n="$(cl_mq_running_nodes "$i")" && [ "$n" = "$CL_N" ]; do
        if ! mq_running; then
            tail_log "$d/log/$NODE.log" "$d/server.out"
            die "RabbitMQ node $i ($NODE) exited (logs: $d/log/$NODE.log $d/server.out)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail_log "$d/log/$NODE.log"
            die "RabbitMQ node $i ($NODE) sees ${n:-no} running nodes, not $CL_N, after ${MQ_TIMEOUT}s (log: $d/log/$NODE.log)"
        fi
        sleep 1
    done
}

# ---------------------------------------------------------------- commands

cl_stop_all() {
    local i
    for i in $(seq "$CL_N" -1 1); do cl_mq_node "$i"; stop_mq; done
    # Galera: the last one down is the one safe to bootstrap from
    for i in $(seq "$CL_N" -1 1); do cl_db_node "$i"; stop_db; done
    stop_epmd
}

cl_all_stopped() {
    local bad=0 i p
    for i in $(seq 1 "$CL_N"); do
        cl_db_node "$i"; cl_mq_node "$i"
        for p in "$(db_pid)" "$(db_launcher_pid)" "$(mq_pid)" "$(mq_launcher_pid)"; do
            if pid_alive "$p"; then log "process $p is still alive"; bad=1; fi
        done
    done
    pid_alive "$(epmd_pid)" && { log "epmd $(epmd_pid) is still alive"; bad=1; }
    return "$bad"
}

cl_down() {
    local keep="$1" i alts=()
    for i in $(seq 1 "$CL_N"); do
        cl_mq_node "$i"
        [ -L "$MQ_LINK" ] && alts+=("$(mq_dir)")
        [ -L "$CL_DIR/db$i" ] && alts+=("$(cl_db_dir "$i")")
    done
    cl_stop_all
    cl_all_stopped || die "some cluster processes survived; state kept in $CL_DIR"
    if [ "$keep" != 1 ]; then
        rm -rf "$CL_DIR" "${alts[@]}"
        for i in $(seq 1 "$CL_N"); do
            rm -f "${TMPDIR:-/tmp}/inbox-cluster-$(printf '%s' "$CL_DIR" | md5sum | cut -c1-12)-$i.sock"
        done
    fi
}

cl_up() {
    local keep="$KEEP" a i t0=$SECONDS
    for a in "$@"; do
        case "$a" in
            --keep) keep=1 ;;
            *) die "up --cluster: unknown option $a" ;;
        esac
    done
    need_packages
    [ -f "$GALERA_PROVIDER" ] || {
        if is_root && command -v apt-get >/dev/null; then
            log "installing galera-4 rsync with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q galera-4 rsync lsof socat
        else
            die "missing package galera-4 (as root: apt-get install -y galera-4 rsync lsof socat)"
        fi
    }
    command -v rsync >/dev/null || die "missing rsync (the Galera state transfer; apt-get install rsync)"
    if cl_status >/dev/null 2>&1; then
        log "cluster already up (state in $CL_DIR)"
        return 0
    fi
    if [ "$keep" != 1 ] && [ -e "$CL_DIR" ]; then
        log "wiping previous cluster state in $CL_DIR"
        cl_down 0
    fi
    mkdir -p "$CL_DIR"
    chmod 755 "$CL_DIR"
    trap 'if [ $? -ne 0 ]; then log "up --cluster failed; stopping what was started (state kept in $CL_DIR for the logs)"; cl_stop_all || true; fi' EXIT
    start_epmd
    # Galera: node 1 bootstraps, the others join it one at a time (each
    # takes a state transfer from a donor, which is busy meanwhile).
    cl_start_db 1 1
    cl_db_node 1
    local deadline=$((SECONDS + DB_TIMEOUT))
    until db_ping && [ "$(cl_db_status_var wsrep_local_state_comment)" = Synced ]; do
        db_running || { tail_log "$DB_LOG"; die "Galera node 1 (port $DB_PORT) exited during bootstrap (log: $DB_LOG)"; }
        [ "$SECONDS" -ge "$deadline" ] && { tail_log "$DB_LOG"; die "Galera node 1 (port $DB_PORT) did not bootstrap within ${DB_TIMEOUT}s (log: $DB_LOG)"; }
        sleep 0.5
    done
    setup_db
    for i in $(seq 2 "$CL_N"); do
        cl_start_db "$i"
        cl_db_node "$i"
        deadline=$((SECONDS + DB_TIMEOUT))
        until db_ping && [ "$(cl_db_status_var wsrep_local_state_comment)" = Synced ]; do
            db_running || { tail_log "$DB_LOG" "$DB_DIR/mariadbd.out"; die "Galera node $i (port $DB_PORT) exited while joining (log: $DB_LOG)"; }
            [ "$SECONDS" -ge "$deadline" ] && { tail_log "$DB_LOG"; die "Galera node $i (port $DB_PORT) did not join within ${DB_TIMEOUT}s (log: $DB_LOG)"; }
            sleep 0.5
        done
    done
    for i in $(seq 1 "$CL_N"); do cl_db_wait "$i"; done
    # RabbitMQ: node 1, then the others join it.
    for i in $(seq 1 "$CL_N"); do cl_start_mq "$i"; done
    for i in $(seq 2 "$CL_N"); do cl_mq_join "$i"; done
    cl_mq_node 1
    setup_mq
    for i in $(seq 1 "$CL_N"); do cl_mq_wait "$i"; done
    trap - EXIT
    log "cluster up in $((SECONDS - t0))s: AMQP 127.0.0.1:$CL_AMQP_PORT-$((CL_AMQP_PORT + CL_N - 1)), Galera MariaDB 127.0.0.1:$CL_DB_PORT-$((CL_DB_PORT + CL_N - 1)); eval \"\$($SELF env --cluster)\""
}

cl_status() {
    local i n=0 total=$((2 * CL_N)) s state size run
    for i in $(seq 1 "$CL_N"); do
        cl_mq_node "$i"
        if mq_up; then
            run="$(cl_mq_running_nodes "$i")"
            echo "rabbitmq $i: running pid $(mq_pid) port $AMQP_PORT node $NODE, sees ${run:-?} running"
            [ "$run" = "$CL_N" ] && n=$((n + 1))
        elif mq_running; then echo "rabbitmq $i: starting/unresponsive pid $(mq_pid)"
        else echo "rabbitmq $i: stopped"; fi
    done
    for i in $(seq 1 "$CL_N"); do
        cl_db_node "$i"
        if db_up; then
            state="$(cl_db_status_var wsrep_local_state_comment)"
            size="$(cl_db_status_var wsrep_cluster_size)"
            echo "galera   $i: running pid $(db_pid) port $DB_PORT, $state, cluster size $size"
            [ "$state" = Synced ] && [ "$size" = "$CL_N" ] && n=$((n + 1))
        elif db_running; then echo "galera   $i: starting/unresponsive pid $(db_pid)"
        else echo "galera   $i: stopped"; fi
    done
    if epmd_up; then echo "epmd:      running pid $(epmd_pid) port $EPMD_PORT"; else echo "epmd:      stopped"; fi
    if [ "$n" -eq "$total" ]; then s=0; elif [ "$n" -eq 0 ]; then s=3; else s=1; fi
    return "$s"
}

cl_urls() {  # kind: amqp|db|migrate|test|test_migrate [first node]
    local kind="$1" first="${2:-1}" i k list=""
    for k in $(seq 0 $((CL_N - 1))); do
        i=$(( (first - 1 + k) % CL_N + 1 ))
        case "$kind" in
            amqp) list="$list${list:+,}amqp://inbox:inbox@127.0.0.1:$((CL_AMQP_PORT + i - 1))/inbox" ;;
            db) list="$list${list:+,}mysql://inbox:inbox@127.0.0.1:$((CL_DB_PORT + i - 1))/inbox" ;;
            migrate) list="$list${list:+,}mysql://inbox_owner:inbox_owner@127.0.0.1:$((CL_DB_PORT + i - 1))/inbox" ;;
            test) list="$list${list:+,}mysql://inbox:inbox@127.0.0.1:$((CL_DB_PORT + i - 1))/inbox_test" ;;
            test_migrate) list="$list${list:+,}mysql://inbox_owner:inbox_owner@127.0.0.1:$((CL_DB_PORT + i - 1))/inbox_test" ;;
        esac
    done
    printf '%s' "$list"
}

cl_env() {
    local i any=0
    # Any node of ours running will do: the chaos runs and the cluster
    # tests kill nodes and still read these (refuse_env, scripts/stack).
    for i in $(seq 1 "$CL_N"); do
        cl_mq_node "$i"; mq_running && any=1
        cl_db_node "$i"; db_running && any=1
    done
    [ "$any" = 1 ] || STACK_DIR="$CL_DIR" refuse_env "no node running" "scripts/stack up --cluster"
    cat <<EOF
export INBOX_AMQP_URL=$(cl_urls amqp)
export INBOX_DB_URL=$(cl_urls db)
export INBOX_MIGRATE_DB_URL=$(cl_urls migrate)
export INBOX_TEST_DB_URL=$(cl_urls test)
export INBOX_TEST_MIGRATE_DB_URL=$(cl_urls test_migrate)
export INBOX_DLQ_TYPE=quorum
export INBOX_CLUSTER=1
export INBOX_CLUSTER_NODES=$CL_N
export INBOX_CLUSTER_STACK="$SELF --cluster"
export INBOX_CLUSTER_DIR=$CL_DIR
export INBOX_CLUSTER_AMQP_PORT=$CL_AMQP_PORT
export INBOX_CLUSTER_DIST_PORT=$CL_DIST_PORT
export INBOX_CLUSTER_EPMD_PORT=$CL_EPMD_PORT
export INBOX_CLUSTER_DB_PORT=$CL_DB_PORT
export INBOX_CLUSTER_GALERA_PORT=$CL_GALERA_PORT
export INBOX_CLUSTER_NODENAME=$CL_NODEPREFIX
EOF
    # The same lists starting at node i: a worker given these prefers node i.
    for i in $(seq 1 "$CL_N"); do
        echo "export INBOX_CLUSTER_AMQP_URL_$i=$(cl_urls amqp "$i")"
        echo "export INBOX_CLUSTER_DB_URL_$i=$(cl_urls db "$i")"
        echo "export INBOX_CLUSTER_TEST_DB_URL_$i=$(cl_urls test "$i")"
    done
}

# The node (1-N) whose broker leads quorum queue $1, from the first node up.
cl_leader() {
    local q="${1:-orders.inbox}" i out
    for i in $(seq 1 "$CL_N"); do
        cl_mq_node "$i"
        mq_up || continue
        out="$(CTL_TIMEOUT=15 mqctl list_queues -p inbox --no-table-headers --silent name leader 2>/dev/null |
               awk -v q="$q" '$1 == q { print $2 }')" || continue
        [ -n "$out" ] || continue
        out="${out#"$CL_NODEPREFIX"}"
        printf '%s\n' "${out%%@*}"
        return 0
    done
    die "no running node knows a leader of queue $q"
}

cluster_main() {
    local cmd="$1"; shift
    local node="" args=() a
    cl_globals
    while [ $# -gt 0 ]; do
        case "$1" in
            --node) node="${2:-}"; shift 2 || die "--node needs a number" ;;
            --node=*) node="${1#--node=}"; shift ;;
            *) args+=("$1"); shift ;;
        esac
    done
    if [ -n "$node" ]; then
        case "$node" in
            [1-9]) [ "$node" -le "$CL_N" ] || die "--node $node: the cluster has $CL_N nodes" ;;
            *) die "--node takes 1..$CL_N, not '$node'" ;;
        esac
    fi
    need_node() { [ -n "$node" ] || die "$cmd --cluster needs --node N (1..$CL_N)"; }
    case "$cmd" in
        up) cl_up "${args[@]}" ;;
        down)
            local keep="$KEEP"
            for a in "${args[@]}"; do [ "$a" = --keep ] && keep=1; done
            cl_down "$keep"
            log "cluster down" ;;
        status) cl_status ;;
        env) cl_env ;;
        ctl)
            if [ -z "$node" ]; then
                for a in $(seq 1 "$CL_N"); do cl_mq_node "$a"; mq_up && { node="$a"; break; }; done
                [ -n "$node" ] || die "no RabbitMQ node of the cluster is up"
            fi
            cl_mq_node "$node"; mqctl "${args[@]}" ;;
        sql)
            if [ -z "$node" ]; then
                for a in $(seq 1 "$CL_N"); do cl_db_node "$a"; db_up && { node="$a"; break; }; done
                [ -n "$node" ] || die "no Galera node of the cluster is up"
            fi
            cl_db_node "$node"; db_sql_root inbox "${args[@]}" ;;
        stop-db) need_node; cl_db_node "$node"; stop_db; log "galera node $node stopped" ;;
        kill-db) need_node; cl_db_node "$node"; kill_db; log "galera node $node killed" ;;
        start-db) need_node; start_epmd; cl_start_db "$node"; cl_db_wait "$node"; log "galera node $node up and Synced" ;;
        restart-db) need_node; cl_db_node "$node"; stop_db; cl_start_db "$node"; cl_db_wait "$node"; log "galera node $node restarted" ;;
        stop-mq) need_node; cl_mq_node "$node"; stop_mq; log "rabbitmq node $node stopped" ;;
        kill-mq) need_node; cl_mq_node "$node"; kill_mq; log "rabbitmq node $node killed" ;;
        start-mq) need_node; start_epmd; cl_start_mq "$node"; cl_mq_wait "$node"; log "rabbitmq node $node up, $CL_N running" ;;
        restart-mq) need_node; cl_mq_node "$node"; stop_mq; cl_start_mq "$node"; cl_mq_wait "$node"; log "rabbitmq node $node restarted" ;;
        db-pid) need_node; cl_db_node "$node"; db_pid; echo ;;
        mq-pid) need_node; cl_mq_node "$node"; mq_pid; echo ;;
        leader) cl_leader "${args[@]}" ;;
        logs)
            for a in $(seq 1 "$CL_N"); do
                cl_db_node "$a"; echo "$DB_LOG"
                cl_mq_node "$a"; [ -e "$MQ_LINK" ] && ls -1 "$(mq_dir)"/log/*.log 2>/dev/null
            done; true ;;
        help|-h|--help|"") awk 'NR > 1 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$(dirname "$SELF")/stack-cluster.sh" ;;
        *) die "unknown command '$cmd' for --cluster (see: scripts/stack help --cluster)" ;;
    esac
}
