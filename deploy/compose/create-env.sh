#!/usr/bin/env bash
# Write deploy/compose/.env (mode 0600) with fresh random secrets for compose.yaml.
# Refuses to replace an existing file: a new placeholder key invalidates every placeholder
# guests hold. Keep the file out of version control (.gitignore here does).
set -euo pipefail
cd "$(dirname "$0")"
random_hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }   # 32 bytes, 64 hex characters
if [[ -e .env ]]; then
    echo "deploy/compose/.env exists; not replacing it" >&2
    exit 1
fi
umask 077
cat > .env <<ENV
SANDGATE_PLACEHOLDER_KEY=$(random_hex)
SANDGATE_REDIS_PASSWORD=$(random_hex)
SANDGATE_ADMIN_TOKEN=$(random_hex)
ENV
echo "wrote deploy/compose/.env (mode 0600)" >&2
