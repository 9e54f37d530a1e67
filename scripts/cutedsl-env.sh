# Sourced by the GPU scripts (run from the repository root).
#
# `use_cutedsl_release VERSION` makes python3 import nvidia-cutlass-dsl VERSION, from the first of:
#   .cutedsl/cutedsl-VERSION.tar.xz (../shared/tools/pack-cutedsl VERSION, for CPython 3.12 on x86-64),
#     unpacked once into /tmp/cutedsl-VERSION (a warm machine's later call finds it there, archive or not);
#   the folder .cutedsl/VERSION (pip install --no-deps --target .cutedsl/VERSION nvidia-cutlass-dsl==VERSION
#     nvidia-cutlass-dsl-libs-base==VERSION);
#   the folder NVFP4_EXTRA_CUTLASS_DSL names (as the tests read it), if it holds VERSION;
#   the installed release, if it is VERSION.
# It checks the release python3 then imports, and fails, saying what to do, where none is VERSION. Each
# release gets its own CuTe DSL cache folder (CUTE_DSL_CACHE_DIR).
#
# Sourcing this file also does what the GPU scripts need before they pick a release: where python3 cannot
# import the DSL at all, the newest .cutedsl archive; LEADERBOARD_REFERENCE_DIR at .lbref when that is present.
CUTEDSL_BASE_PYTHONPATH=${CUTEDSL_BASE_PYTHONPATH-${PYTHONPATH:-}}

cutedsl_python_path() {  # a pip --target folder (or unpacked archive): the paths its .pth would add
  echo "$1/nvidia_cutlass_dsl/python_packages:$1/nvidia_cutlass_dsl/dsl_packages:$1"
}

cutedsl_version() {
  python3 -c "import cutlass; print(cutlass.__version__)" 2>/dev/null
}

use_cutedsl_release() {
  local version=$1 unpacked=/tmp/cutedsl-$1 root found tried=()
  if [ -f ".cutedsl/cutedsl-$version.tar.xz" ] && [ ! -f "$unpacked/.unpacked" ]; then
    rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xJf ".cutedsl/cutedsl-$version.tar.xz" \
      && touch "$unpacked/.unpacked"
  fi
  export CUTE_DSL_CACHE_DIR=/tmp/cutlass_python_cache-$version
  for root in "$unpacked" "$PWD/.cutedsl/$version" "${NVFP4_EXTRA_CUTLASS_DSL:-}" ""; do
    if [ -n "$root" ]; then
      [ -d "$root/nvidia_cutlass_dsl" ] || continue
      export PYTHONPATH=$(cutedsl_python_path "$root")${CUTEDSL_BASE_PYTHONPATH:+:$CUTEDSL_BASE_PYTHONPATH}
    else
      export PYTHONPATH=$CUTEDSL_BASE_PYTHONPATH
    fi
    found=$(cutedsl_version)
    [ "$found" = "$version" ] && return 0
    tried+=("${root:-installed}: ${found:-none}")
  done
  echo "nvidia-cutlass-dsl $version not found (${tried[*]}): ../shared/tools/pack-cutedsl $version (carry" \
       ".cutedsl), or pip install --no-deps --target .cutedsl/$version nvidia-cutlass-dsl==$version" \
       "nvidia-cutlass-dsl-libs-base==$version" >&2
  return 1
}

if [ -z "$(cutedsl_version)" ]; then
  cutedsl_newest=$(ls .cutedsl/cutedsl-*.tar.xz 2>/dev/null | sed 's/.*cutedsl-\(.*\)\.tar\.xz/\1/' | sort -V | tail -1)
  [ -n "$cutedsl_newest" ] && use_cutedsl_release "$cutedsl_newest"
fi
[ -d .lbref ] && export LEADERBOARD_REFERENCE_DIR=$PWD/.lbref
true
