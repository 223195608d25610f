#!/usr/bin/env bash
# Print the path of a headless-capable Chromium for the site tests (sitetests/), installing
# Debian's `chromium` package with apt-get when none is found (that needs root, as CI has).
# No browser is ever downloaded by the tests themselves: Playwright drives this executable.
#
#   CHROMIUM="$(scripts/chromium.sh)"
#
# Environment: CHROMIUM (use this executable instead). Progress goes to stderr.
set -euo pipefail

say() { echo "chromium: $*" >&2; }

if [[ -n "${CHROMIUM:-}" ]]; then
    [[ -x "$CHROMIUM" ]] || { say "error: CHROMIUM=$CHROMIUM is not executable"; exit 1; }
    echo "$CHROMIUM"
    exit 0
fi
for candidate in chromium chromium-browser; do
    if path="$(command -v "$candidate")"; then
        echo "$path"
        exit 0
    fi
done
if [[ "$(id -u)" != 0 ]]; then
    say "error: no chromium found; install Debian's package (apt-get install chromium) or set CHROMIUM"
    exit 1
fi
say "installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq chromium >&2
command -v chromium
