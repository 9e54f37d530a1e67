# Sourced by the GPU scripts: unpacks .cutedsl/cutedsl-*.tar.xz (../shared/tools/pack-cutedsl),
# if present, for machines without nvidia-cutlass-dsl and without a package index, and puts it
# on PYTHONPATH; points LEADERBOARD_REFERENCE_DIR at .lbref when that is present.
for archive in .cutedsl/cutedsl-*.tar.xz; do
  [ -f "$archive" ] || continue
  mkdir -p /tmp/cutedsl && tar -C /tmp/cutedsl -xJf "$archive"
  export PYTHONPATH=/tmp/cutedsl/nvidia_cutlass_dsl/python_packages:/tmp/cutedsl/nvidia_cutlass_dsl/dsl_packages:/tmp/cutedsl:${PYTHONPATH:-}
done
[ -d .lbref ] && export LEADERBOARD_REFERENCE_DIR=$PWD/.lbref
true
