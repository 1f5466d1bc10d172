#!/bin/sh
# install.sh PREFIX [SOURCE]: gpuscope and its dependencies in a virtual
# environment at PREFIX, without what no gpuscope process loads, compiled.
# The Dockerfile's builder stage runs it; bench/image_size.py runs the same
# script to measure what the image holds (no Docker engine on our machines).
# EXTRAS (environment, e.g. EXTRAS=fleet; the Dockerfile's build arg): extras
# of pyproject.toml installed too. None by default: `fleet` (s3fs, gcsfs,
# botocore) adds ~60 MB to an image at 388 MB of its 400 (docs/kubernetes.md).
set -eu
prefix=$1
source=${2:-.}
extras=${EXTRAS:-}

python3 -m venv "$prefix"
"$prefix/bin/pip" install --no-cache-dir --no-compile --disable-pip-version-check -q \
    "$source${extras:+[$extras]}"
# The image runs agents and analyzers; reports with pictures are drawn where
# on-call people run `gpuscope report --html` (matplotlib, its fonts and
# Pillow: ~80 MB). EXTRAS=report keeps them.
case ",$extras," in
    *,report,*) ;;
    *) "$prefix/bin/pip" uninstall -y -q matplotlib fonttools pillow kiwisolver contourpy cycler ;;
esac
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
# Some wheels ship their libraries with symbol tables (pyarrow's,
# cryptography's Rust core: 20 MB); strip those (the dynamic symbols the
# loader needs stay), and nothing else: not what auditwheel grafted into
# *.libs/, whose segments Debian 12's strip misaligns (numpy's OpenBLAS then
# fails to load: found by bench/image_build.py), nor what is stripped already.
find . -path '*.libs' -prune -o -type f -name '*.so*' -print | while read -r lib; do
    if readelf -S "$lib" 2>/dev/null | grep -q '\.symtab'; then
        strip --strip-unneeded "$lib"
    fi
done
# The container's file system is read-only: without .pyc files every start,
# and every health probe, would compile its imports again.
"$prefix/bin/python" -m compileall -q -j 0 "$site" >/dev/null
