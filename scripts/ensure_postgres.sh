#!/usr/bin/env bash
# Make sure PostgreSQL's server programs (initdb, pg_ctl) are installed, so the tests can start a throwaway server
# (tests/conftest.py, fixture postgres_server_url). When they are missing: as root with apt-get (CI: a fresh Debian 12
# machine), install Debian's postgresql package; otherwise print what to do and exit 0 (the PostgreSQL tests then
# skip, saying why). Exits non-zero only when an install was attempted and failed.
set -euo pipefail

find_initdb() {
  local found
  found=$(command -v initdb 2>/dev/null || true)
  if [ -z "$found" ]; then
    found=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  [ -n "$found" ] && echo "$found"
}

if found=$(find_initdb); then
  echo "ensure_postgres: PostgreSQL server programs found ($found)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  cat >&2 <<'MSG'
ensure_postgres: no PostgreSQL server programs (initdb, pg_ctl) found, and not root with apt-get, so not installing.
  To run the PostgreSQL tests, either install the server (Debian/Ubuntu: sudo apt-get install -y postgresql),
  or point the tests at a running server: export AGENTBOLT_TEST_POSTGRES_URL=postgresql://user@host:port/dbname
  Without either, make test still passes and the PostgreSQL tests are skipped with this reason.
MSG
  exit 0
fi

echo "ensure_postgres: installing Debian's postgresql package"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y postgresql
if ! found=$(find_initdb); then
  echo "ensure_postgres: the postgresql package is installed but no initdb was found" >&2
  exit 1
fi
echo "ensure_postgres: installed ($found)"
