#!/bin/sh
# Rebuilds dist/report.js and dist/report.css from src/ and style.css: the bundle the launcher
# embeds in every report page (crates/oxgrind-report/src/page.rs, include_str!). The built files
# are committed, so `cargo build` needs neither npm nor the network; run this after editing the
# front end, then commit src/ and dist/ together. esbuild is pinned; it comes from npm.
set -eu
cd "$(dirname "$0")"
ESBUILD="npx --yes esbuild@0.24.0"
$ESBUILD src/main.js --bundle --format=iife --minify --target=es2020 \
    --legal-comments=none --outfile=dist/report.js
$ESBUILD style.css --minify --outfile=dist/report.css
# What the bundle was built from, checked by a unit test (src/page.rs) so a change to src/
# without a rebuild fails the tests instead of shipping a stale page.
cat src/*.js style.css | sha256sum | cut -d' ' -f1 > dist/source.sha256
wc -c dist/report.js dist/report.css
