#!/usr/bin/env bash
# Create a Cloud TPU VM or pod slice for bertflow pretraining (one gcloud call).
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: infra/tpu/create.sh --name NAME --zone ZONE --project PROJECT [options]

Creates a TPU VM (v4-8: one host, 4 chips) or a pod slice (v4-32: 4 hosts, 16 chips) with
`gcloud compute tpus tpu-vm create`. Then: infra/tpu/install.sh, infra/tpu/launch.sh,
infra/tpu/delete.sh. On a pod slice every host trains (one SPMD program, each host streams its
own part of the data) and host 0 alone writes: "TPU pods" in docs/pretraining.md.

  --name NAME              TPU name (required)
  --zone ZONE              zone with the accelerator, e.g. us-central2-b for v4 (required)
  --project PROJECT        GCP project (required)
  --accelerator-type TYPE  v4-8 | v4-32 | v5litepod-16 | ... (default: v4-32, a 4-host pod slice)
  --version VERSION        TPU software (runtime) version; default by accelerator type, as
                           https://cloud.google.com/tpu/docs/runtimes lists them for PyTorch:
                           v2/v3/v4: tpu-ubuntu2204-base, v5e (v5litepod-*): v2-alpha-tpuv5-lite,
                           v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e (another type needs --version)
  --service-account EMAIL  the hosts' service account (needs read/write on the gs:// root)
  --spot                   a Spot (preemptible) slice: cheaper; a preempted run resumes
                           from its last gs:// checkpoint when relaunched
  --dry-run                print the command, run nothing
  -h, --help               this text
TXT
}

NAME="" ZONE="" PROJECT="" ACCEL="v4-32" VERSION="" SA="" SPOT=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCEL=$2; shift 2 ;;
    --version) need_value "$@"; VERSION=$2; shift 2 ;;
    --service-account) need_value "$@"; SA=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require "$NAME" --name
require "$ZONE" --zone
require "$PROJECT" --project
[[ "$ACCEL" =~ ^v[0-9a-z]+-[0-9]+$ ]] || die "--accelerator-type '$ACCEL' is not a TPU type like v4-32"
if [[ -z "$VERSION" ]]; then  # the runtime image of each generation (the TPU runtimes page)
  case "$ACCEL" in
    v2-*|v3-*|v4-*) VERSION="tpu-ubuntu2204-base" ;;
    v5litepod-*|v5e-*) VERSION="v2-alpha-tpuv5-lite" ;;
    v5p-*) VERSION="v2-alpha-tpuv5" ;;
    v6e-*) VERSION="v2-alpha-tpuv6e" ;;
    *) die "--accelerator-type '$ACCEL': no default runtime image known for it; give --version" ;;
  esac
fi

cmd=(gcloud compute tpus tpu-vm create "$NAME" --project "$PROJECT" --zone "$ZONE"
     --accelerator-type "$ACCEL" --version "$VERSION")
[[ -n "$SA" ]] && cmd+=(--service-account "$SA" --scopes https://www.googleapis.com/auth/cloud-platform)
[[ "$SPOT" == 1 ]] && cmd+=(--spot)
run "${cmd[@]}"
