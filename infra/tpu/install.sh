#!/usr/bin/env bash
# Install bertflow with its `xla` extra on every host of a TPU VM / pod slice.
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: infra/tpu/install.sh --name NAME --zone ZONE --project PROJECT [--ref REF] [--dry-run]

Packs this checkout (`git archive REF`), copies it to every host (`tpu-vm scp --worker=all`)
and runs infra/tpu/host_setup.sh there (`tpu-vm ssh --worker=all`): Python 3.11, a venv in
~/bertflow/.venv, the project with the xla extra (torch 2.9 + torch-xla[tpu] 2.9) and gcp.

  --name NAME        TPU name (required)
  --zone ZONE        its zone (required)
  --project PROJECT  GCP project (required)
  --ref REF          the git revision to install (default: HEAD)
  --dry-run          print the commands, run nothing
  -h, --help         this text
TXT
}

NAME="" ZONE="" PROJECT="" REF="HEAD"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --ref) need_value "$@"; REF=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require "$NAME" --name
require "$ZONE" --zone
require "$PROJECT" --project

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARBALL="${TMPDIR:-/tmp}/bertflow-src-$NAME.tar.gz"
TPU=(--project "$PROJECT" --zone "$ZONE" --worker=all)

run git -C "$REPO" archive --format=tar.gz -o "$TARBALL" "$REF"
run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:bertflow-src.tar.gz" "${TPU[@]}"
run gcloud compute tpus tpu-vm ssh "$NAME" "${TPU[@]}" --command \
  'rm -rf ~/bertflow && mkdir -p ~/bertflow && tar xzf ~/bertflow-src.tar.gz -C ~/bertflow && bash ~/bertflow/infra/tpu/host_setup.sh'
