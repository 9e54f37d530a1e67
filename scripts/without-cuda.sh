#!/usr/bin/env bash
# Runs a command as on a machine with no CUDA toolkit: every PATH folder that holds a ptxas, or is named like
# a CUDA install, left out; PTXAS, CUDA_HOME and CUDA_PATH unset. Fails (exit 3) if a ptxas is still on PATH.
# The compile gate then finds the ptxas of the nvidia-cuda-nvcc wheel, a dependency of this package.
#
#   bash scripts/without-cuda.sh python eval.py
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: bash scripts/without-cuda.sh COMMAND [ARG...]" >&2; exit 2; }
kept=()
IFS=: read -ra folders <<<"${PATH:-}"
for folder in "${folders[@]}"; do
    [[ -z "$folder" || -e "$folder/ptxas" || "$folder" == *cuda* ]] || kept+=("$folder")
done
PATH="$(IFS=:; echo "${kept[*]}")"
export PATH
unset PTXAS CUDA_HOME CUDA_PATH
if found="$(command -v ptxas)"; then
    echo "without-cuda.sh: a ptxas is still on PATH: $found" >&2
    exit 3
fi
exec "$@"
