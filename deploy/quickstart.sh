#!/usr/bin/env bash
# One command from a fresh clone to a running gateway:
#   deploy/quickstart.sh [--config FILE] [--port N]
# Without --config: the embedded defaults (explicit HTTP/CONNECT proxy on 127.0.0.1:8080,
# policy from ./rules, state and audit in $SANDGATE_HOME or ~/.sandgate) and the demo
# sandbox's token. --config and --port go to `sandgate run` (--config to every step).
# One line per phase on stderr; `sandgate run` prints where everything is once it serves.
set -euo pipefail

usage() { echo "usage: deploy/quickstart.sh [--config FILE] [--port N]" >&2; exit "${1:-2}"; }
config=() port=()
while (( $# )); do
    case "$1" in
        --config)
            [[ $# -ge 2 ]] || usage
            [[ -f "$2" ]] || { echo "quickstart: no such config file: $2" >&2; exit 2; }
            config=(--config "$(realpath "$2")"); shift 2 ;;
        --port)
            [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || usage
            port=(--port "$2"); shift 2 ;;
        -h|--help) usage 0 ;;
        *) usage ;;
    esac
done

cd "$(dirname "$0")/.."
sg=.venv/bin/sandgate
step() { echo "quickstart [$1/6] $2" >&2; }

step 1 "system packages (apt-get when one is missing)"
deploy/install.sh --only system
step 2 "virtualenv .venv (about 30 s the first time)"
deploy/install.sh --only venv

if (( ${#config[@]} )); then
    step 3 "sandbox tokens: skipped (the tenant files of ${config[1]} name their own)"
    rules=$(.venv/bin/python -c 'import sys; from pathlib import Path
from sandgate.proxy.config import load_config
print(load_config(Path(sys.argv[1])).rules_path)' "${config[1]}")
else
    token_file=rules/tenants/demo-1.token
    step 3 "demo sandbox token ($token_file)"
    [[ -f "$token_file" ]] || "$sg" token --output "$token_file" 2>/dev/null
    rules=rules
fi

step 4 "gateway CA"
"$sg" ca export "${config[@]}" >/dev/null 2>&1 || "$sg" ca init "${config[@]}" >/dev/null

step 5 "policy check ($rules)"
"$sg" policy check "$rules" "${config[@]}" >/dev/null

args=("${config[@]}" "${port[@]}")
step 6 "starting: sandgate run${args[*]:+ ${args[*]}} (Ctrl-C stops it)"
exec "$sg" run "${args[@]}"
