#!/bin/sh
# Installs, from Debian, what bench/run.py needs: the peers it compares against
# (Valgrind, heaptrack), the real programs it runs (python3, sqlite3, xz), the compilers
# for its own workloads (gcc, g++; rustc comes from the Rust toolchain that builds oxgrind)
# and zstd (heaptrack compresses its output with it).
# Idempotent: does nothing when everything is there; runs `apt-get update` only when a
# package is missing. Needs root (or sudo).
set -eu

# command that must exist -> Debian package that provides it
NEEDED="valgrind:valgrind heaptrack:heaptrack sqlite3:sqlite3 xz:xz-utils zstd:zstd \
gcc:gcc g++:g++ python3:python3 ms_print:valgrind"

missing=""
for pair in $NEEDED; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    # python3 must be Debian's own (/usr/bin), not a pyenv or venv shim on PATH
    if [ "$cmd" = python3 ]; then
        [ -x /usr/bin/python3 ] && continue
    elif command -v "$cmd" >/dev/null 2>&1; then
        continue
    fi
    case " $missing " in *" $pkg "*) ;; *) missing="$missing $pkg" ;; esac
done

if [ -z "$missing" ]; then
    echo "bench/setup.sh: everything is installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "bench/setup.sh: installing:$missing"
$SUDO apt-get update
# shellcheck disable=SC2086 # word splitting of the package list is intended
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $missing
