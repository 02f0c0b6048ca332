#!/bin/sh
# The project's test command (README; .ci/run runs exactly this).
# Installs what the tests compare against or run (Valgrind, compilers, real programs), builds
# the workspace (the tests run the launcher and the runtime library it preloads), then runs
# every test.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-packages.sh \
    valgrind:valgrind ms_print:valgrind gcc:gcc g++:g++ /usr/bin/python3:python3 \
    /usr/bin/sqlite3:sqlite3 /usr/bin/perl:perl /usr/bin/git:git /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev \
    /usr/lib/debug/.build-id:libc6-dbg c++filt:binutils
cargo build --workspace --locked
cargo test --workspace --locked
