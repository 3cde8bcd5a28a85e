#!/usr/bin/env bash
# Set up sandgate on a fresh Debian/Ubuntu machine: system packages, then a venv in .venv.
#   deploy/install.sh          the gateway
#   deploy/install.sh --dev    plus what the tests need (pytest, mypy, ruff, ...)
#   --only system|venv         one of the two phases (deploy/quickstart.sh shows each)
# Idempotent: re-running installs only what is missing. Needs root for apt (or sudo).
set -euo pipefail

# The package manager's locks. A fresh cloud machine holds them for minutes after boot
# (cloud-init, apt-daily, unattended-upgrades), and apt-get stops at once on a held one:
# wait for them instead. SANDGATE_APT_LOCKS: other files to wait on (tests/e2e/deploy/test_install.py).
read -r -a apt_locks <<< "${SANDGATE_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock}"
apt_lock_wait=${SANDGATE_APT_LOCK_WAIT:-900}   # seconds

# "PID COMMAND" of a process holding a lock (fcntl, as apt and dpkg take it, or flock) on the
# file, read from /proc/locks (no root needed); nothing, and status 1, when none does.
lock_holder() {
    local dev ino id pid fields
    read -r dev ino < <(stat -L -c '%d %i' "$1" 2>/dev/null) || return 1
    # /proc/locks names the file as MAJOR:MINOR:INODE, the device numbers in hex.
    printf -v id '%02x:%02x:%d' $(( ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xfffff000) )) \
        $(( (dev & 0xff) | ((dev >> 12) & 0xffffff00) )) "$ino"
    while read -r -a fields; do
        [[ "${fields[1]:-}" == "->" ]] && fields=("${fields[0]}" "${fields[@]:2}")  # a waiter
        [[ "${fields[5]:-}" == "$id" ]] || continue
        pid=${fields[4]}
        echo "$pid $(cat "/proc/$pid/comm" 2>/dev/null || echo '?')"
        return 0
    done < /proc/locks
    return 1
}

# Wait until no package manager lock is held, saying so once; status 1 after apt_lock_wait s.
wait_for_apt_locks() {
    local lock holder waited=0 said=0
    while true; do
        holder=""
        for lock in "${apt_locks[@]}"; do
            holder=$(lock_holder "$lock") && break
        done
        [[ -n "$holder" ]] || break
        if (( ! said )); then
            echo "install.sh: waiting for $lock, held by process ${holder%% *} (${holder#* }):" \
                 "a fresh machine installs its updates for a while after boot (up to ${apt_lock_wait} s)" >&2
            said=1
        fi
        if (( waited >= apt_lock_wait )); then
            echo "install.sh: $lock is still held after ${apt_lock_wait} s: run deploy/install.sh again" \
                 "once process ${holder%% *} (${holder#* }) is done" >&2
            return 1
        fi
        sleep 1
        waited=$(( waited + 1 ))
    done
    if (( said )); then
        echo "install.sh: the package manager is free after ${waited} s" >&2
    fi
    return 0
}

# Sourced (tests/e2e/deploy/test_install.py): the functions only.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

cd "$(dirname "$0")/.."

dev=0 only=""
while (( $# )); do
    case "$1" in
        --dev) dev=1 ;;
        --only) [[ "${2:-}" == system || "${2:-}" == venv ]] || { echo "install.sh: --only system|venv" >&2; exit 2; }
                only=$2; shift ;;
        *) echo "usage: deploy/install.sh [--dev] [--only system|venv]" >&2; exit 2 ;;
    esac
    shift
done

# redis-server: workers > 1 share limit counts through a private one (proxy/workers/limit_relay.py).
packages=(curl ca-certificates iproute2 nftables redis-server)
# dev: rsyslog (the syslog sink's receiver), chromium and its driver (the console's browser tests).
if (( dev )); then packages+=(wrk nginx-light rsyslog rsyslog-gnutls chromium chromium-driver); fi
missing=()
[[ "$only" == venv ]] && packages=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
    sudo_cmd=()
    (( EUID == 0 )) || sudo_cmd=(sudo)
    echo "installing system packages: ${missing[*]}" >&2
    wait_for_apt_locks
    # And should one be taken again between the wait and apt-get, apt-get waits too (apt >= 1.9).
    apt=(apt-get -o "DPkg::Lock::Timeout=$apt_lock_wait")
    "${sudo_cmd[@]}" "${apt[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" "${apt[@]}" install -y -qq "${missing[@]}" >/dev/null
fi

find_python() {
    local want candidates=()
    want=$(cat .python-version 2>/dev/null || echo 3.13)
    candidates+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want"*/bin/python)
    candidates+=("$(command -v "python$want" || true)" "$(command -v python3.13 || true)"
                 "$(command -v python3.12 || true)" "$(command -v python3 || true)")
    for c in "${candidates[@]}"; do
        [[ -n "$c" && -x "$c" ]] || continue
        if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$c"; return 0
        fi
    done
    return 1
}

[[ "$only" == system ]] && exit 0

if [[ ! -x .venv/bin/python ]]; then
    python=$(find_python) || { echo "sandgate needs Python 3.12 or newer (python3.12/python3.13 or pyenv)" >&2; exit 1; }
    echo "creating .venv with $python" >&2
    "$python" -m venv .venv
fi
extras=""
(( dev )) && extras="[dev]"
stamp=".venv/.sandgate-installed$extras"
current() { [[ -f "$1" && ! pyproject.toml -nt "$1" && ! deploy/constraints.txt -nt "$1" ]]; }
# A dev install holds everything the gateway needs: after one, the plain install has nothing to do.
if ! current "$stamp" && ! current ".venv/.sandgate-installed[dev]"; then
    # pip's whole output goes to a log; a failure shows its end and stops here (an earlier
    # install would still import, and the stamp would hide the failure from the next run).
    log=.venv/pip-install.log
    # --no-compile: pip compiles file by file on one core; the venv is compiled below, on all.
    # -c: the versions the suite last passed with (deploy/constraints.txt says how to move them).
    if ! .venv/bin/python -m pip install --disable-pip-version-check --no-compile \
            -c deploy/constraints.txt -e ".$extras" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "install.sh: pip install failed (the whole output: $log)" >&2
        exit 1
    fi
    grep -E "^(WARNING|DEPRECATION):" "$log" | grep -v "^WARNING: Location" >&2 || true
    # Every process imports from bytecode, also where PYTHONDONTWRITEBYTECODE keeps Python from
    # writing it (a file that does not compile only stays uncompiled: not an install failure).
    .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
    .venv/bin/python -c "import sandgate.proxy.cli.main" || { echo "sandgate failed to install" >&2; exit 1; }
    touch "$stamp"
fi
# Byte-compile sandgate's own modules (an editable install compiles nothing): with
# PYTHONDONTWRITEBYTECODE set, as on some hosts, every `sandgate` process would otherwise
# compile them from source, about 0.5 s of CPU per gateway start. Fresh files are skipped.
.venv/bin/python -m compileall -q -j 0 "$PWD/proxy" "$PWD/policy" "$PWD/brokers" >/dev/null
