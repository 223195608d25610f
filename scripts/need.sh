#!/usr/bin/env bash
# Print the path of PROGRAM, installing Debian's PACKAGE (default: PROGRAM) with apt-get when
# PROGRAM is not on PATH; that needs root, as CI has. PROGRAM may also be an absolute path to
# a file the package installs (a data file, not a command). Used by the Makefile for what the
# docs build and the site tests need (graphviz's dot, the standard library's Sphinx inventory
# from python3.11-doc, chromium), as pg-test-cluster.sh does for PostgreSQL. Progress goes to
# stderr.
#
#   scripts/need.sh PROGRAM [PACKAGE]
#   scripts/need.sh /ABSOLUTE/PATH PACKAGE
set -euo pipefail

program="${1:?usage: scripts/need.sh PROGRAM [PACKAGE]}"
package="${2:-$program}"
say() { echo "need: $*" >&2; }
find_it() {
    if [[ "$program" == /* ]]; then
        [[ -f "$program" ]] && echo "$program"
    else
        command -v "$program"
    fi
}

if path="$(find_it)"; then
    echo "$path"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    say "error: $program not found; install Debian's $package package (apt-get install $package)"
    exit 1
fi
say "installing Debian's $package package for $program"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq "$package" >&2
if ! find_it; then
    say "error: Debian's $package package did not install $program"
    exit 1
fi
