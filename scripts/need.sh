#!/usr/bin/env bash
# Print the path of PROGRAM, installing Debian's PACKAGE (default: PROGRAM) with apt-get when
# PROGRAM is not on PATH; that needs root, as CI has. Used by the Makefile for the tools the
# docs build and the site tests need (graphviz's dot, chromium), as pg-test-cluster.sh does
# for PostgreSQL. Progress goes to stderr.
#
#   scripts/need.sh PROGRAM [PACKAGE]
set -euo pipefail

program="${1:?usage: scripts/need.sh PROGRAM [PACKAGE]}"
package="${2:-$program}"
say() { echo "need: $*" >&2; }

if path="$(command -v "$program")"; then
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
command -v "$program"
