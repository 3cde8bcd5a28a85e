#!/usr/bin/env bash
# One command from a fresh clone to a running gateway on its embedded defaults:
# explicit HTTP/CONNECT proxy on 127.0.0.1:8080, policy from ./rules, audit to ~/.sandgate.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install.sh
sg=.venv/bin/sandgate
state="${SANDGATE_HOME:-$HOME/.sandgate}"
token_file=rules/tenants/demo-1.token
[[ -f "$token_file" ]] || "$sg" token --output "$token_file" 2>/dev/null
[[ -f "$state/ca/mitmproxy-ca.pem" ]] || "$sg" ca init >/dev/null
"$sg" policy check rules
cat >&2 <<MSG

sandgate is starting on 127.0.0.1:8080 (Ctrl-C stops it).
  CA certificate (trust it in guests that need inspection): $state/ca/mitmproxy-ca-cert.pem
  audit trail (JSON lines):                                 $state/audit/audit.jsonl
  the demo sandbox's proxy URL:  http://demo-1:\$(cat $token_file)@127.0.0.1:8080
Try a denied request:
  curl -i -x "http://demo-1:\$(cat $token_file)@127.0.0.1:8080" http://example.com/

MSG
exec "$sg" run
