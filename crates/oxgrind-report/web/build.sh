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
wc -c dist/report.js dist/report.css
