#!/usr/bin/env bash
# Launch (or stop) the pretrain stage on every host of a TPU VM / pod slice, data and
# checkpoints on gs://, the XLA backend, metrics to the deployment's MLflow server.
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: infra/tpu/launch.sh --name NAME --zone ZONE --project PROJECT --root gs://BUCKET/RUN
                           --mlflow-uri URL [options]

Runs `python -m flows.proc.cluster` on every host (`tpu-vm ssh --worker=all`), in the background
(log: ~/bertflow-pretrain.log on each host). Host 0 (the TPU's agent-worker-number) runs
`bertflow stage pretrain` (preflight, MLflow run, manifest); the other hosts run the same
training process. The XLA backend (PJRT_DEVICE=TPU, BERTFLOW_BACKEND=xla), SPMD over the
chips of all hosts: each host streams its own part of the example shards from gs:// and feeds
its slice of the global batch; host 0 alone writes checkpoints under ROOT/pretrain.
A relaunch resumes from the last checkpoint.

  --name NAME          TPU name (required)
  --zone ZONE          its zone (required)
  --project PROJECT    GCP project (required)
  --root URL           run root, gs:// (required): checkpoints go to ROOT/pretrain
  --mlflow-uri URL     MLflow tracking server (required; default $MLFLOW_TRACKING_URI)
  --preset NAME        base | large | ... (default: large)
  --examples URL       example shards (gs://; default ROOT/examples)
  --vocab URL          vocabulary (gs://; default ROOT/vocab)
  --set FIELD=VALUE    config override, repeatable (e.g. pretrain.phases.0.steps=1000)
  --env-file FILE      KEY=VALUE lines (MLFLOW_TRACKING_USERNAME/PASSWORD, ...) copied to
                       ~/bertflow.env (mode 600) on every host and sourced: secrets never
                       appear on a command line
  --stop               SIGTERM the run on every host (it checkpoints, then exits)
  --dry-run            print the commands, run nothing
  -h, --help           this text
TXT
}

NAME="" ZONE="" PROJECT="" ROOT="" MLFLOW="${MLFLOW_TRACKING_URI:-}" PRESET="large" EXAMPLES="" VOCAB=""
ENV_FILE="" STOP=0 SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --root) need_value "$@"; ROOT=$2; shift 2 ;;
    --mlflow-uri) need_value "$@"; MLFLOW=$2; shift 2 ;;
    --preset) need_value "$@"; PRESET=$2; shift 2 ;;
    --examples) need_value "$@"; EXAMPLES=$2; shift 2 ;;
    --vocab) need_value "$@"; VOCAB=$2; shift 2 ;;
    --set) need_value "$@"; [[ "$2" == *=* ]] || die "--set $2: expected FIELD=VALUE"; SETS+=("$2"); shift 2 ;;
    --env-file) need_value "$@"; ENV_FILE=$2; shift 2 ;;
    --stop) STOP=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require "$NAME" --name
require "$ZONE" --zone
require "$PROJECT" --project
TPU=(--project "$PROJECT" --zone "$ZONE" --worker=all)

if [[ "$STOP" == 1 ]]; then
  # shellcheck disable=SC2016 # expanded on the host
  run gcloud compute tpus tpu-vm ssh "$NAME" "${TPU[@]}" --command \
    'test -f ~/bertflow-pretrain.pid && kill -TERM "$(cat ~/bertflow-pretrain.pid)" || echo "no run on $(hostname)"'
  exit 0
fi

require "$ROOT" --root
gs_url "$ROOT" --root
require "$MLFLOW" "--mlflow-uri (or MLFLOW_TRACKING_URI)"
[[ -z "$EXAMPLES" ]] || gs_url "$EXAMPLES" --examples
[[ -z "$VOCAB" ]] || gs_url "$VOCAB" --vocab
[[ -z "$ENV_FILE" || -f "$ENV_FILE" ]] || die "--env-file $ENV_FILE does not exist"

args=(-m flows.proc.cluster --preset "$PRESET" --root "$ROOT" --mlflow-uri "$MLFLOW")
[[ -n "$EXAMPLES" ]] && args+=(--input "examples=$EXAMPLES")
[[ -n "$VOCAB" ]] && args+=(--input "vocab=$VOCAB")
for s in "${SETS[@]}"; do args+=(--set "$s"); done

METADATA='http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number'
remote="cd ~/bertflow && export PJRT_DEVICE=TPU BERTFLOW_BACKEND=xla MLFLOW_TRACKING_URI=$(quote "$MLFLOW")"
remote+=" TPU_WORKER_ID=\$(curl -s -H Metadata-Flavor:Google $METADATA)"
remote+=" && if [ -f ~/bertflow.env ]; then set -a; . ~/bertflow.env; set +a; fi"
remote+=" && nohup .venv/bin/python $(quote "${args[@]}") > ~/bertflow-pretrain.log 2>&1 < /dev/null &"
remote+=" echo \$! > ~/bertflow-pretrain.pid; echo \"\$(hostname): worker \$TPU_WORKER_ID started, pid \$!\""

if [[ -n "$ENV_FILE" ]]; then
  run gcloud compute tpus tpu-vm scp "$ENV_FILE" "$NAME:bertflow.env" "${TPU[@]}"
  run gcloud compute tpus tpu-vm ssh "$NAME" "${TPU[@]}" --command 'chmod 600 ~/bertflow.env'
fi
run gcloud compute tpus tpu-vm ssh "$NAME" "${TPU[@]}" --command "$remote"
# the follow-up command, quoted like the others (a comment line in a dry run: pasting it runs nothing)
follow="follow host 0: $(quote gcloud compute tpus tpu-vm ssh "$NAME" --project "$PROJECT" --zone "$ZONE" \
  --worker=0 --command 'tail -f ~/bertflow-pretrain.log')"
if [[ "$DRY_RUN" == 1 ]]; then
  echo "# $follow"
else
  echo "$follow" >&2
fi
