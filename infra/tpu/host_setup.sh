#!/usr/bin/env bash
# Runs ON each TPU host (infra/tpu/install.sh copies the source and calls it on --worker=all):
# Python 3.11, a venv, the project with its `xla` and `gcp` extras and torch 2.9 (torch-xla 2.9
# only works with torch 2.9.x, so the core pin torch==2.13.0 is replaced on these hosts).
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: bash ~/bertflow/infra/tpu/host_setup.sh [--src DIR] [--venv DIR | --system-python] [--dry-run]

  --src DIR         the unpacked source (default: the folder two levels above this script)
  --venv DIR        the venv to create (default: SRC/.venv)
  --system-python   no apt, no venv: install into the running python3 (the TPU image,
                    infra/tpu/Dockerfile, whose base image is Python 3.11)
  --dry-run    print the commands, run nothing
  -h, --help   this text
TXT
}

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)" VENV="" SYSTEM=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --src) need_value "$@"; SRC=$2; shift 2 ;;
    --venv) need_value "$@"; VENV=$2; shift 2 ;;
    --system-python) SYSTEM=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
VENV=${VENV:-$SRC/.venv}
[[ -f "$SRC/pyproject.toml" ]] || die "--src $SRC has no pyproject.toml"

# requirements: the core pins but torch, the xla extra with [tpu] (libtpu), the gcp extra, torch 2.9
REQS="$SRC/.tpu-requirements.txt"
PICK='import sys, tomllib
p = tomllib.load(open(sys.argv[1] + "/pyproject.toml", "rb"))["project"]
extra = p["optional-dependencies"]
core = [d for d in p["dependencies"] if not d.replace(" ", "").startswith("torch=")]
xla = [d.replace("torch-xla==", "torch-xla[tpu]==") for d in extra["xla"]]
print("\n".join(core + xla + extra["gcp"] + ["torch==" + xla[0].split("==")[1]]))'

if [[ "$SYSTEM" == 1 ]]; then
  PY=python3
else
  run sudo apt-get update -qq
  run sudo apt-get install -y -qq python3.11 python3.11-venv
  run python3.11 -m venv "$VENV"
  PY="$VENV/bin/python"
fi
if [[ "$DRY_RUN" == 1 ]]; then
  echo "+ $(quote "$PY" -c "$PICK" "$SRC") > $(quote "$REQS")"
else
  "$PY" -c "$PICK" "$SRC" > "$REQS"
fi
run "$PY" -m pip install -q -r "$REQS" -f https://storage.googleapis.com/libtpu-releases/index.html
run "$PY" -m pip install -q --no-deps -e "$SRC"
if [[ "$SYSTEM" == 0 ]]; then  # on a TPU VM: the host sees its chips through torch-xla
  run env PJRT_DEVICE=TPU "$PY" -c "import torch_xla, torch_xla.runtime as xr; print('devices', xr.global_runtime_device_count())"
fi
