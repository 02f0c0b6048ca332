#!/bin/sh
# Installs Debian packages for the commands named on the command line, as `command:package`
# pairs, only when a command is missing; runs `apt-get update` once, only then.
# Used by scripts/setup.sh, scripts/test.sh and bench/setup.sh, so a clean machine gets
# what the project needs from the project's own scripts.
set -eu
missing=""
for pair in "$@"; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    case "$cmd" in
        /*) [ -e "$cmd" ] && continue ;;          # an absolute path must exist as is
        *) command -v "$cmd" >/dev/null 2>&1 && continue ;;
    esac
    case " $missing " in *" $pkg "*) ;; *) missing="$missing $pkg" ;; esac
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing Debian packages:$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # the package list is meant to split
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
