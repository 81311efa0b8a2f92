#!/usr/bin/env bash
# Launch the pretrain stage on this node of a GPU cluster: torchrun over the node's GPUs,
# several nodes through a static rendezvous on node 0 (flows.proc.cluster + flows.proc.launch).
set -euo pipefail
# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
  cat <<'TXT'
Usage: infra/gpu/launch.sh --nnodes N [--node-rank R] [--rdzv-endpoint HOST:PORT]
                           --nproc-per-node G --root URL [options]

Run on every node (the Kubernetes indexed Job infra/gpu/k8s/pretrain-job.yaml does). Node 0
runs `bertflow stage pretrain` (preflight, MLflow run, manifest written last) and torchrun as
rendezvous node 0; the other nodes run the same training processes and record nothing.
torchrun gets --nnodes N --node_rank R --rdzv_backend=static --rdzv_endpoint HOST:PORT
--nproc_per_node G (one node: --standalone).

  --nnodes N             nodes in the job (required)
  --node-rank R          this node, 0..N-1 (default: $JOB_COMPLETION_INDEX of an indexed Job)
  --rdzv-endpoint H:P    node 0's host:port (required with N > 1)
  --nproc-per-node G     training processes = GPUs on this node (required)
  --root URL             run root (gs://bucket/path; checkpoints under ROOT/pretrain) (required)
  --preset NAME          base | large | ... (default: large; large is FSDP, bf16)
  --mlflow-uri URL       MLflow tracking server (default: $MLFLOW_TRACKING_URI)
  --examples URL         example shards (default ROOT/examples)
  --vocab URL            vocabulary (default ROOT/vocab)
  --set FIELD=VALUE      config override, repeatable
  --rdzv-id ID           rendezvous id, the same on every node (default: bertflow)
  --python PATH          interpreter (default: python3)
  --dry-run              print the commands (and this node's torchrun line), run nothing
  -h, --help             this text
TXT
}

NNODES="" RANK_="${JOB_COMPLETION_INDEX:-}" ENDPOINT="" NPROC="" ROOT="" PRESET="large"
MLFLOW="${MLFLOW_TRACKING_URI:-}" EXAMPLES="" VOCAB="" RDZV_ID="bertflow" PY="python3" SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) need_value "$@"; NNODES=$2; shift 2 ;;
    --node-rank) need_value "$@"; RANK_=$2; shift 2 ;;
    --rdzv-endpoint) need_value "$@"; ENDPOINT=$2; shift 2 ;;
    --nproc-per-node) need_value "$@"; NPROC=$2; shift 2 ;;
    --root) need_value "$@"; ROOT=$2; shift 2 ;;
    --preset) need_value "$@"; PRESET=$2; shift 2 ;;
    --mlflow-uri) need_value "$@"; MLFLOW=$2; shift 2 ;;
    --examples) need_value "$@"; EXAMPLES=$2; shift 2 ;;
    --vocab) need_value "$@"; VOCAB=$2; shift 2 ;;
    --set) need_value "$@"; [[ "$2" == *=* ]] || die "--set $2: expected FIELD=VALUE"; SETS+=("$2"); shift 2 ;;
    --rdzv-id) need_value "$@"; RDZV_ID=$2; shift 2 ;;
    --python) need_value "$@"; PY=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require "$NNODES" --nnodes
require "$NPROC" --nproc-per-node
require "$ROOT" --root
RANK_=${RANK_:-0}
[[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "--nnodes must be a positive integer, got '$NNODES'"
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive integer, got '$NPROC'"
[[ "$RANK_" =~ ^[0-9]+$ && "$RANK_" -lt "$NNODES" ]] || die "--node-rank must lie in 0..$((NNODES - 1)), got '$RANK_'"
if [[ "$NNODES" -gt 1 ]]; then
  require "$ENDPOINT" "--rdzv-endpoint (node 0's HOST:PORT, needed with --nnodes $NNODES)"
  [[ "$ENDPOINT" == *:* ]] || die "--rdzv-endpoint must be HOST:PORT, got '$ENDPOINT'"
fi
if [[ "$RANK_" == 0 && -z "$MLFLOW" && "$ROOT" == *://* ]]; then
  die "missing required argument --mlflow-uri (or MLFLOW_TRACKING_URI): a gs:// root has no local MLflow database"
fi

args=(-m flows.proc.cluster --preset "$PRESET" --root "$ROOT" --nproc-per-node "$NPROC")
[[ -n "$MLFLOW" ]] && args+=(--mlflow-uri "$MLFLOW")
[[ -n "$EXAMPLES" ]] && args+=(--input "examples=$EXAMPLES")
[[ -n "$VOCAB" ]] && args+=(--input "vocab=$VOCAB")
for s in "${SETS[@]}"; do args+=(--set "$s"); done

export BERTFLOW_NNODES="$NNODES" BERTFLOW_NODE_RANK="$RANK_" BERTFLOW_RDZV_ENDPOINT="$ENDPOINT"
export BERTFLOW_RDZV_ID="$RDZV_ID" BERTFLOW_BACKEND="${BERTFLOW_BACKEND:-cuda}"
if [[ "$DRY_RUN" == 1 ]]; then  # each NAME=VALUE one quoted word: a value is never shell syntax
  echo "+ export $(quote "BERTFLOW_NNODES=$NNODES" "BERTFLOW_NODE_RANK=$RANK_" "BERTFLOW_RDZV_ENDPOINT=$ENDPOINT" \
    "BERTFLOW_RDZV_ID=$RDZV_ID" "BERTFLOW_BACKEND=$BERTFLOW_BACKEND")"
fi
run "$PY" "${args[@]}"
if [[ "$DRY_RUN" == 1 ]]; then  # what flows.proc.cluster would start on this node (reads no input)
  # from this checkout, so a dry run needs only bash and a python3 (not the project installed)
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PY" "${args[@]}" --dry-run | sed 's/^/# /'
fi
