#!/bin/sh
# One command on a fresh Debian 12 machine: installs what oxgrind needs, builds it, puts
# `oxgrind` on the PATH (/usr/local/bin), and runs the main job once: Massif on python3,
# rendered by Valgrind's own ms_print and by ours.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-packages.sh gcc:gcc valgrind:valgrind ms_print:valgrind /usr/bin/python3:python3
cargo build --release --locked
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO ln -sf "$(pwd)/target/release/oxgrind" /usr/local/bin/oxgrind
echo "oxgrind installed: $(command -v oxgrind) -> $(pwd)/target/release/oxgrind"

demo=$(mktemp -d)
cd "$demo"
oxgrind --tool=massif --massif-out-file=massif.out.demo \
    /usr/bin/python3 -c 'words = [str(i) * 3 for i in range(200000)]; print(len(words), "strings")'
ms_print massif.out.demo > valgrind-ms_print.txt
oxgrind ms_print massif.out.demo > oxgrind-ms_print.txt
head -n 32 oxgrind-ms_print.txt
if cmp -s valgrind-ms_print.txt oxgrind-ms_print.txt; then
    echo "(Valgrind's ms_print and oxgrind ms_print print the same $(wc -l < oxgrind-ms_print.txt) lines; files in $demo)"
else
    echo "warning: Valgrind's ms_print and ours differ on $demo/massif.out.demo" >&2
    exit 1
fi
