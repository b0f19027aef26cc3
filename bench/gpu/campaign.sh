#!/bin/sh
# Every GPU check of bench/gpu/ in one command (about 8 minutes on one H100 or H200):
#     bench/gpu/campaign.sh OUTDIR [--dry-run] [--only NAME,...]
# Needs only python3 and this repository: campaign.py makes .venv and installs what the checks
# need. It never changes the GPU's MIG mode, compute mode, clocks or power limit.
cd "$(dirname "$0")/../.." || exit 1
exec python3 bench/gpu/campaign.py "$@"
