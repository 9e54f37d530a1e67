# Sourced by the GPU scripts. Where python3 cannot import nvidia-cutlass-dsl (a lent GPU
# machine without a package index), unpacks .cutedsl/cutedsl-*.tar.xz (made by
# ../shared/tools/pack-cutedsl for CPython 3.12) and puts it on PYTHONPATH; points
# LEADERBOARD_REFERENCE_DIR at .lbref when that is present.
if ! python3 -c "import cutlass" 2>/dev/null; then
  for archive in .cutedsl/cutedsl-*.tar.xz; do
    [ -f "$archive" ] || continue
    # a warm machine's second call finds it unpacked already
    done_mark=/tmp/cutedsl/.unpacked-$(basename "$archive")
    [ -f "$done_mark" ] || { mkdir -p /tmp/cutedsl && tar -C /tmp/cutedsl -xJf "$archive" && touch "$done_mark"; }
    export PYTHONPATH=/tmp/cutedsl/nvidia_cutlass_dsl/python_packages:/tmp/cutedsl/nvidia_cutlass_dsl/dsl_packages:/tmp/cutedsl:${PYTHONPATH:-}
  done
fi
[ -d .lbref ] && export LEADERBOARD_REFERENCE_DIR=$PWD/.lbref
true
