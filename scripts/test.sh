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
    /usr/lib/debug/.build-id:libc6-dbg c++filt:binutils \
    chromium:chromium /usr/bin/node:nodejs /usr/bin/xz:xz-utils
# Third-party readers of Valgrind's formats, for tests/third_party_consumers.rs: a CI parser
# of Valgrind XML and a massif.out parser, from PyPI, pinned, in a venv of our own (and a JSON
# Schema validator for SARIF).
consumers=target/consumers-venv
if [ ! -x "$consumers/bin/valgrind-ci" ] || ! "$consumers/bin/python" -c "import msparser, jsonschema" 2>/dev/null; then
    /usr/bin/python3 -m venv "$consumers" 2>/dev/null || {
        sh scripts/install-packages.sh /usr/lib/python3.11/ensurepip:python3-venv
        /usr/bin/python3 -m venv "$consumers"
    }
    # jsonschema validates `oxgrind report --format=sarif` against the vendored SARIF schema.
    "$consumers/bin/pip" install -q valgrindci==0.3.0 msparser==1.4 jsonschema==4.17.3
fi
export OXGRIND_TEST_PYTHON="$(pwd)/$consumers/bin/python"
cargo build --workspace --locked
# The release build too (what scripts/setup.sh installs): tests/release_build.rs runs it.
cargo build --release --locked -p oxgrind -p oxgrind-runtime
export OXGRIND_TEST_RELEASE=1
cargo test --workspace --locked
