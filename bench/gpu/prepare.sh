#!/bin/bash
# Wheels the device image lacks (pure Python, so any Python 3 there takes them),
# into .gpuwheels/, which .git/info/exclude ignores and `carry` sends.
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.gpuwheels/' .git/info/exclude 2>/dev/null || echo '/.gpuwheels/' >> .git/info/exclude
mkdir -p .gpuwheels
.venv/bin/pip download -q --no-deps -d .gpuwheels structlog apscheduler tzlocal
ls .gpuwheels
