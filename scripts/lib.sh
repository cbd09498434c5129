# scripts/lib.sh — shell helpers shared by scripts/test, scripts/demo,
# scripts/chaos and bench/run.  Source it; it defines functions only and changes nothing.

# inbox_install_deps PKG... — install the Debian packages of the list that
# are not installed yet, with apt-get when we are root; otherwise print the
# command to run and return 1.  The servers (RabbitMQ, MariaDB) are
# scripts/stack's business, not this list's.
inbox_install_deps() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        printf '\n==> installing %s\n' "${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "missing packages: ${missing[*]}" >&2
        echo "run as root: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${missing[*]}" >&2
        return 1
    fi
}

# The packages the build needs (tests add libcriterion-dev and valgrind).
INBOX_BUILD_DEPS=(meson ninja-build pkg-config gcc libc6-dev librabbitmq-dev libmariadb-dev
    libjansson-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev)

# inbox_meson_setup DIR OPTIONS... — configure DIR, or reconfigure it when
# it was configured before (so changed options take effect).
inbox_meson_setup() {
    local dir="$1"; shift
    if [ -f "$dir/meson-private/coredata.dat" ]; then
        meson setup --reconfigure "$dir" "$@"
    else
        rm -rf "$dir"
        meson setup "$dir" "$@"
    fi
}

# inbox_wait_started TIMEOUT_S PID LOG [PID LOG]... — wait (bounded) until
# each worker has logged that it consumes.  Returns 1 as soon as one of
# them has exited, or when TIMEOUT_S pass first: the caller says which.
inbox_wait_started() {
    local timeout=$1 t0=$SECONDS pid log
    shift
    while [ "$#" -ge 2 ]; do
        pid=$1 log=$2
        shift 2
        until grep -q ' consuming ' "$log" 2>/dev/null; do
            kill -0 "$pid" 2>/dev/null || return 1
            [ $((SECONDS - t0)) -lt "$timeout" ] || return 1
            sleep 0.2
        done
    done
}

# inbox_port_open PORT — true when something listens on 127.0.0.1:PORT.
inbox_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# inbox_free_port [FROM [TO]] — a loopback TCP port nothing listens on now,
# the first from FROM to TO (default 19400-19999): a worker's /metrics in a
# bench run, or next to the default 9464 in the demo.
inbox_free_port() {
    local p from="${1:-19400}" to="${2:-19999}"
    for p in $(seq "$from" "$to"); do
        if ! inbox_port_open "$p"; then
            echo "$p"
            return 0
        fi
    done
    echo "no free port in $from-$to" >&2
    return 1
}

# inbox_bench_empty_queues STACK VHOST — empty the queues a bench run reads:
# purge the inbox and its DLQ, and delete the load generator's verify queue
# (`inbox-loadgen publish` declares it again).  The verify queue keeps every
# run's emitted messages (the verifier only browses it), and purging a
# classic queue of some hundred thousand persistent messages that were
# browsed and requeued kept the broker busy for over ten minutes here;
# deleting it takes a moment.
inbox_bench_empty_queues() {
    local stack=$1 vhost=$2 q
    for q in orders.inbox orders.inbox.dlq; do
        "$stack" ctl purge_queue -p "$vhost" "$q" >/dev/null 2>&1 || true
    done
    "$stack" ctl delete_queue -p "$vhost" orders.out.verify >/dev/null 2>&1 || true
    # Queues the integration suites declared (itest.*) stay bound to the
    # exchanges after their test; on a stack the tests used, each took a
    # copy of every event the bench emits and skewed the figures (six of
    # them made a run a third slower).
    for q in $("$stack" ctl list_queues -p "$vhost" name --quiet --no-table-headers 2>/dev/null | grep '^itest\.' || true); do
        "$stack" ctl delete_queue -p "$vhost" "$q" >/dev/null 2>&1 || true
    done
}
