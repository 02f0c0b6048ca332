#!/bin/sh
# Regenerates the screenshots in docs/report/ from the reference examples: each view of the
# page, rendered by Debian's headless Chromium (tests/chromium.py). Run after changing the
# front end (and web/build.sh); needs a built `oxgrind` (cargo build) and chromium.
set -eu
cd "$(dirname "$0")/../../.."
ex=${EXAMPLES:-../shared/reference/examples}
out=docs/report
tmp=$(mktemp -d)
mkdir -p "$out"
ox=target/debug/oxgrind
shot() { # page.html name [eval-before-shot]
    pre=${3:-}
    if [ -n "$pre" ]; then
        printf '[{"eval": %s}, {"screenshot": "%s"}]' "$pre" "$out/$2.png" > "$tmp/steps.json"
    else
        printf '[{"screenshot": "%s"}]' "$out/$2.png" > "$tmp/steps.json"
    fi
    /usr/bin/python3 crates/oxgrind-report/tests/chromium.py "$1" "$tmp/steps.json"
}
$ox report "$ex/massif/massif.out.default" -o "$tmp/massif.html"
shot "$tmp/massif.html" massif
$ox report "$ex/dhat/dhat.out.heap" -o "$tmp/dhat.html"
shot "$tmp/dhat.html" dhat '"document.querySelector(\"[data-test=dhat-tree] .node\").click()"'
$ox report -I "$ex/src" "$ex/memcheck/mc_errors.plain.xml" -o "$tmp/memcheck.html"
shot "$tmp/memcheck.html" memcheck
$ox report "$ex/cachegrind/cachegrind.out.static" -o "$tmp/cachegrind.html"
shot "$tmp/cachegrind.html" cachegrind
$ox diff --html "$ex/dhat/dhat.out.heap2" "$ex/dhat/dhat.out.heap" -o "$tmp/diff.html"
shot "$tmp/diff.html" diff
rm -rf "$tmp"
