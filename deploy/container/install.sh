#!/bin/sh
# install.sh PREFIX [SOURCE]: gpuscope and its dependencies in a virtual
# environment at PREFIX, without what no gpuscope process loads, compiled.
# The Dockerfile's builder stage runs it; bench/image_size.py runs the same
# script to measure what the image holds (no Docker engine on our machines).
set -eu
prefix=$1
source=${2:-.}

python3 -m venv "$prefix"
"$prefix/bin/pip" install --no-cache-dir --no-compile --disable-pip-version-check -q "$source"
# pip and setuptools only install things: a running gpuscope never imports them
"$prefix/bin/pip" uninstall -y -q pip setuptools

site=$("$prefix/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cd "$site"
# pyarrow ships Flight (RPC) and S3, which nothing here imports (DuckDB's Arrow
# scans load dataset, acero, substrait and parquet, kept), C++ headers, tests,
# and libarrow_python three times under its link names: the loader asks for
# the .so.NNNN name only (readelf -d lib*.so: NEEDED libarrow_python.so.NNNN).
rm -rf pyarrow/include pyarrow/src pyarrow/tests \
       pyarrow/libarrow_flight.so.* pyarrow/_flight.*.so pyarrow/libarrow_python_flight.so* \
       pyarrow/libarrow_s3.so.* pyarrow/_s3fs.*.so
rm -f pyarrow/libarrow_python.so pyarrow/libarrow_python.so.*.*.*
find . -depth -type d -name tests -path '*/numpy/*' -exec rm -rf {} +
# Wheels ship some libraries with their symbol tables (pyarrow, OpenBLAS,
# cryptography's Rust core: 25 MB); the dynamic symbols the loader needs stay.
find . -type f -name '*.so*' -exec strip --strip-unneeded {} +
# The container's file system is read-only: without .pyc files every start,
# and every health probe, would compile its imports again.
"$prefix/bin/python" -m compileall -q -j 0 "$site" >/dev/null
