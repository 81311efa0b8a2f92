#!/usr/bin/env bash
# Run bertflow's data stages with the Beam jobs on Google Cloud Dataflow: corpus (Dataflow),
# vocab (here: WordPiece training reads the corpus from gs://) and examples (Dataflow), through
# the bertflow CLI, so manifests, skipping and MLflow tracking work as in a local run.
#
#   infra/dataflow/run.sh --project P --region us-central1 --root gs://B/bertflow/base \
#       --mlflow-uri https://mlflow.example --image us-central1-docker.pkg.dev/P/bertflow/beam-worker:0.1.0 \
#       --wiki 'gs://B/dumps/enwiki-20261101-pages-articles-multistream*.xml.bz2' --books gs://B/books
#
# --build builds and pushes the worker image first (docker); --setup-file ships the code as an
# sdist instead of an image. --dry-run prints every command ("+ " lines) and runs none.
# Every --set is passed to every stage, so a later `bertflow run` with the same settings finds
# these stages up to date.
set -euo pipefail

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

flags:
  --project P          Google Cloud project (required)
  --region R           Dataflow region, e.g. us-central1 (required)
  --root URL           run root, gs://... (required)
  --mlflow-uri URI     MLflow tracking server (required: a gs:// root has no local sqlite)
  --image IMAGE        worker image built from infra/dataflow/Dockerfile   } one of
  --setup-file         ship pipeline/ as an sdist (--setup_file) instead    } these two
  --build              docker build + push --image before running
  --temp URL           Dataflow temp/staging folder (default: ROOT/_dataflow/tmp)
  --preset NAME        base | large | small | tiny (default: base)
  --wiki URL --books URL   the raw corpora (default: the preset's)
  --machine-type T     worker VM type (default: n2-highmem-4)
  --workers N          initial workers (default: 4)
  --max-workers N      autoscaling ceiling (default: 64)
  --stages "LIST"      which of "corpus vocab examples" to run (default: all three)
  --set FIELD=VALUE    any further override, repeatable (e.g. corpus.beam.options.network=my-vpc)
  --dry-run            print the commands, run nothing
EOF
}

# shellcheck source=infra/lib.sh source-path=SCRIPTDIR/../..
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"  # die, quote, run (the --dry-run switch), need_value

PROJECT="" REGION="" ROOT="" MLFLOW_URI="" IMAGE="" SETUP_FILE=0 BUILD=0 TEMP="" PRESET=base
WIKI="" BOOKS="" MACHINE_TYPE=n2-highmem-4 WORKERS=4 MAX_WORKERS=64 STAGES="corpus vocab examples"
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --region) need_value "$@"; REGION=$2; shift 2 ;;
    --root) need_value "$@"; ROOT=${2%/}; shift 2 ;;
    --mlflow-uri) need_value "$@"; MLFLOW_URI=$2; shift 2 ;;
    --image) need_value "$@"; IMAGE=$2; shift 2 ;;
    --setup-file) SETUP_FILE=1; shift ;;
    --build) BUILD=1; shift ;;
    --temp) need_value "$@"; TEMP=${2%/}; shift 2 ;;
    --preset) need_value "$@"; PRESET=$2; shift 2 ;;
    --wiki) need_value "$@"; WIKI=$2; shift 2 ;;
    --books) need_value "$@"; BOOKS=$2; shift 2 ;;
    --machine-type) need_value "$@"; MACHINE_TYPE=$2; shift 2 ;;
    --workers) need_value "$@"; WORKERS=$2; shift 2 ;;
    --max-workers) need_value "$@"; MAX_WORKERS=$2; shift 2 ;;
    --stages) need_value "$@"; STAGES=$2; shift 2 ;;
    --set) need_value "$@"; EXTRA+=(--set "$2"); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[[ -n "$PROJECT" ]] || die "missing --project"
[[ -n "$REGION" ]] || die "missing --region"
[[ "$ROOT" == gs://* ]] || die "--root must be a gs:// URL (Dataflow workers cannot see this disk), got '${ROOT}'"
[[ -n "$MLFLOW_URI" ]] || die "missing --mlflow-uri (a gs:// root has no local sqlite database)"
if [[ -n "$IMAGE" && "$SETUP_FILE" == 1 ]]; then die "give --image or --setup-file, not both"; fi
if [[ -z "$IMAGE" && "$SETUP_FILE" == 0 ]]; then die "missing --image IMAGE (or --setup-file)"; fi
if [[ "$BUILD" == 1 && -z "$IMAGE" ]]; then die "--build needs --image"; fi
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, got '$WORKERS'"
[[ "$MAX_WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--max-workers must be a positive integer, got '$MAX_WORKERS'"
for s in $STAGES; do
  [[ "$s" =~ ^(corpus|vocab|examples)$ ]] || die "--stages: unknown stage '$s' (corpus vocab examples)"
done
TEMP=${TEMP:-$ROOT/_dataflow/tmp}
[[ "$TEMP" == gs://* ]] || die "--temp must be a gs:// URL, got '$TEMP'"

REPO=$(cd "$(dirname "$0")/../.." && pwd)
read -r -a BERTFLOW <<<"${BERTFLOW:-bertflow}"  # e.g. BERTFLOW="python3 -m flows.cli"

if [[ "$BUILD" == 1 ]]; then
  run docker build -f "$REPO/infra/dataflow/Dockerfile" -t "$IMAGE" "$REPO"
  run docker push "$IMAGE"
fi

SETS=()
for job in corpus examples; do
  SETS+=(--set "$job.beam.runner=DataflowRunner" --set "$job.beam.project=$PROJECT"
    --set "$job.beam.region=$REGION" --set "$job.beam.temp_location=$TEMP"
    --set "$job.beam.machine_type=$MACHINE_TYPE" --set "$job.beam.num_workers=$WORKERS"
    --set "$job.beam.max_num_workers=$MAX_WORKERS")
done
if [[ "$SETUP_FILE" == 1 ]]; then
  # Beam builds an sdist from the folder of --setup_file: give it setup.py beside a copy of pipeline/
  WORK="${TMPDIR:-/tmp}/bertflow-dataflow-worker"
  run rm -rf "$WORK"
  run mkdir -p "$WORK"
  run cp -R "$REPO/pipeline" "$REPO/infra/dataflow/setup.py" "$REPO/infra/dataflow/requirements.txt" \
    "$REPO/infra/dataflow/MANIFEST.in" "$WORK/"
  SETS+=(--set "corpus.beam.setup_file=$WORK/setup.py" --set "examples.beam.setup_file=$WORK/setup.py")
else
  SETS+=(--set "corpus.beam.sdk_container_image=$IMAGE" --set "examples.beam.sdk_container_image=$IMAGE")
fi
[[ -z "$WIKI" ]] || SETS+=(--set "data.wiki=$WIKI")
[[ -z "$BOOKS" ]] || SETS+=(--set "data.books=$BOOKS")
SETS+=("${EXTRA[@]+"${EXTRA[@]}"}")

for stage in $STAGES; do
  run "${BERTFLOW[@]}" stage "$stage" --preset "$PRESET" --root "$ROOT" --mlflow-uri "$MLFLOW_URI" "${SETS[@]}"
done
