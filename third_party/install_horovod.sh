#!/usr/bin/env bash
# Installs Horovod into a venv: the PyPI sdist built against the venv's TensorFlow, CPU only, with
# the Gloo and MPI (Open MPI from apt) controllers; Gloo runs the CPU collectives by default.
#
#   third_party/install_horovod.sh VENV_PYTHON CACHE_DIR      (what `make horovod` runs)
#
# A no-op when the venv already has a usable Horovod (this version, Gloo + MPI, built for the
# installed TensorFlow; the check imports TensorFlow: seconds). Else it installs the wheel cached
# under CACHE_DIR/wheels (TF_EXT_CACHE_DIR, declared in tf_ext/settings.py: a fresh clone on the
# same machine installs it in seconds), or builds it (about 2 minutes on 2 cores), caches it and
# installs it. The cache key covers everything the binary depends on: Horovod, TensorFlow,
# Python, the build flags, Open MPI.
set -euo pipefail

HOROVOD_VERSION=0.28.1 # the project's one pin of Horovod
BUILD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO)

[ $# -eq 2 ] || {
  echo "usage: $0 VENV_PYTHON CACHE_DIR" >&2
  exit 2
}
py=$1
cache_dir=$2

usable() {
  TF_CPP_MIN_LOG_LEVEL=3 "$py" - "$HOROVOD_VERSION" <<'EOF'
import json, os, sys
import tensorflow as tf, horovod, horovod.tensorflow as hvd
assert horovod.__version__ == sys.argv[1] and hvd.gloo_built() and hvd.mpi_built()
with open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")) as f:
  assert json.load(f)["tensorflow"] == tf.__version__
EOF
}

if usable >/dev/null 2>&1; then
  echo "[setup] horovod $HOROVOD_VERSION present"
  exit 0
fi

tf=$("$py" -c 'from importlib import metadata as m; print(m.version("tensorflow"))' 2>/dev/null) || {
  echo "[setup] $py has no TensorFlow: Horovod is built against it (make venv installs it)" >&2
  exit 1
}
key=$({
  echo "horovod==$HOROVOD_VERSION tensorflow==$tf ${BUILD_ENV[*]}"
  "$py" -VV
  dpkg-query -W -f='${Version}' libopenmpi-dev || true
} | sha256sum | cut -c1-12)
dir="$cache_dir/wheels/horovod-$HOROVOD_VERSION-tf$tf-$key"
whl=$(ls "$dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)

if [ -z "$whl" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  echo "[setup] building horovod $HOROVOD_VERSION from source for tensorflow $tf (about 2 minutes)"
  env "${BUILD_ENV[@]}" MAKEFLAGS=-j"$(nproc)" TMPDIR="$tmp" \
    "$py" -m pip wheel -v --no-cache-dir --no-build-isolation --no-deps --no-binary horovod \
    -w "$tmp/wheel" "horovod==$HOROVOD_VERSION" >"$tmp/build.log" 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do # progress: the last file CMake built or linked
    sleep 15
    last=$(grep -E '^ *\[ *[0-9]+%\] (Building|Linking)' "$tmp/build.log" | tail -n1 |
      sed -E 's|^ *(\[ *[0-9]+%\]) ([A-Za-z]+) .* ([^ ]*/)?([^ /]+)$|\1 \2 \4|') || true
    echo "[setup]   $(($(date +%s) - start))s ${last:-(configuring)}"
  done
  rc=0
  wait $pid || rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 60 "$tmp/build.log"
    mkdir -p "$cache_dir"
    cp "$tmp/build.log" "$cache_dir/horovod-build.log"
    echo "[setup] horovod build FAILED (full log: $cache_dir/horovod-build.log)"
    exit $rc
  fi
  # Into the cache under a temporary name first: an interrupted copy is never taken for a wheel.
  mkdir -p "$dir"
  cp "$tmp"/wheel/horovod-*.whl "$dir/.partial.$$"
  whl="$dir/$(basename "$tmp"/wheel/horovod-*.whl)"
  mv "$dir/.partial.$$" "$whl"
  echo "[setup] built $(basename "$whl") ($(du -h "$whl" | cut -f1), $(($(date +%s) - start))s), cached in $dir"
else
  echo "[setup] horovod $HOROVOD_VERSION from cached wheel $whl"
fi
"$py" -m pip install -q --force-reinstall --no-deps "$whl"
"$py" -m pip install -q "$whl" # its dependencies
usable
echo "[setup] horovod $HOROVOD_VERSION installed (Gloo + MPI)"
