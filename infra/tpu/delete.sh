#!/usr/bin/env bash
# Delete a TPU VM or pod slice (what infra/tpu/create.sh made). Its gs:// outputs stay.
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: infra/tpu/delete.sh --name NAME --zone ZONE --project PROJECT [--dry-run]

Deletes the TPU (billing stops). Checkpoints and outputs under the gs:// root are kept:
a later slice resumes from them.

  --name NAME        TPU name (required)
  --zone ZONE        its zone (required)
  --project PROJECT  GCP project (required)
  --dry-run          print the command, run nothing
  -h, --help         this text
TXT
}

NAME="" ZONE="" PROJECT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require "$NAME" --name
require "$ZONE" --zone
require "$PROJECT" --project

run gcloud compute tpus tpu-vm delete "$NAME" --project "$PROJECT" --zone "$ZONE" --quiet
