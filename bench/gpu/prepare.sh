#!/bin/bash
# Wheels the device image lacks, into .gpuwheels/ (ignored by .git/info/exclude;
# `carry` sends it). The image's Python is 3.12 on x86-64, so compiled wheels
# are fetched for that platform whatever this machine is.
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.gpuwheels/' .git/info/exclude 2>/dev/null || echo '/.gpuwheels/' >> .git/info/exclude
mkdir -p .gpuwheels
.venv/bin/pip download -q --no-deps -d .gpuwheels structlog apscheduler tzlocal pycparser
# the image's grpcio is older than the one our generated code was made with
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpuwheels duckdb msgspec cryptography cffi 'grpcio==1.85.1' 'grpcio-health-checking==1.85.1' protobuf
ls -la .gpuwheels
