#!/usr/bin/env bash
# Write deploy/compose/.env (mode 0600) with fresh random secrets for compose.yaml.
# Refuses to replace an existing file: a new placeholder key invalidates every placeholder
# guests hold, and new store keys cannot open the stored credentials. Keep the file out of
# version control (.gitignore here does).
# SANDGATE_STORE_KEYS is the keyring stored credentials are sealed with: one `id:base64key`
# line per key, newest last; double-quoted so a rotation appends `\nk2:...` inside the quotes.
set -euo pipefail
cd "$(dirname "$0")"
random_hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }   # 32 bytes, 64 hex characters
random_b64() { head -c 32 /dev/urandom | base64 -w0; }            # 32 bytes: one AES-256 key
if [[ -e .env ]]; then
    echo "deploy/compose/.env exists; not replacing it" >&2
    exit 1
fi
umask 077
cat > .env <<ENV
SANDGATE_PLACEHOLDER_KEY=$(random_hex)
SANDGATE_REDIS_PASSWORD=$(random_hex)
SANDGATE_ADMIN_TOKEN=$(random_hex)
SANDGATE_STORE_KEYS="k1:$(random_b64)"
ENV
echo "wrote deploy/compose/.env (mode 0600)" >&2
