#!/usr/bin/env bash
# Installs the peers that benchmarks/scenarios.py compares Mainspring against, each into its own
# virtual environment under .peers/ (never project dependencies, never part of .ci/run):
#   .peers/triton  nvidia-pytriton (ships the tritonserver binary) - Triton as pip users run it
#   .peers/ray     ray[serve]
# Both get the CPU build of torch pinned like the project, numpy, and Mainspring itself without its
# dependencies (the peers serve the same zoo models, built by the same code).
# Usage: bash benchmarks/peers/install.sh [triton] [ray]     (default: both)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(triton ray)
for peer in "${peers[@]}"; do
  case "$peer" in
    triton) packages=("nvidia-pytriton==0.7.0") ;;
    ray) packages=("ray[serve]==2.60.0") ;;
    *) echo "unknown peer: $peer (triton or ray)" >&2; exit 2 ;;
  esac
  venv=.peers/$peer
  if [ -f "$venv/.installed" ]; then echo "$peer: already installed in $venv"; continue; fi
  echo "$peer: installing into $venv"
  $PYTHON -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 numpy msgspec "${packages[@]}"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -e .
  touch "$venv/.installed"
done
