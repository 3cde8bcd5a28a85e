#!/usr/bin/env bash
# Create the Secret sandgate-secrets with fresh random values (never committed anywhere):
#   deploy/k8s/create-secret.sh                 create it in namespace sandgate (kubectl)
#   deploy/k8s/create-secret.sh --print         print the manifest instead (to seal or store)
# Refuses to replace an existing Secret: a new placeholder key invalidates every placeholder
# guests hold, a new redis password locks the gateways out, new store keys cannot open the
# stored credentials. Rotate deliberately (docs/operations/deployment.md).
# store-keys is the keyring stored credentials are sealed with: one `id:base64key` line per
# AES-256 key, newest last (the gateways mount it as a file and re-read it when it changes).
set -euo pipefail
namespace="${SANDGATE_NAMESPACE:-sandgate}"
name=sandgate-secrets

random_hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }   # 32 bytes, 64 hex characters
random_b64() { head -c 32 /dev/urandom | base64 -w0; }            # 32 bytes: one AES-256 key
b64() { printf '%s' "$1" | base64 -w0; }

manifest() {
    cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $name
  namespace: $namespace
  labels:
    app.kubernetes.io/name: sandgate
type: Opaque
data:
  placeholder-key: $(b64 "$(random_hex)")
  redis-password: $(b64 "$(random_hex)")
  admin-token: $(b64 "$(random_hex)")
  store-keys: $(b64 "k1:$(random_b64)")
YAML
}

if [[ "${1:-}" == "--print" ]]; then
    manifest
    exit 0
fi
if kubectl -n "$namespace" get secret "$name" >/dev/null 2>&1; then
    echo "secret $namespace/$name exists; not replacing it (see docs/operations/deployment.md to rotate)" >&2
    exit 1
fi
manifest | kubectl create -f -
