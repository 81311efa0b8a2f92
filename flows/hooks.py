"""The stage rows' hooks: what each stage checks before any work, how it is shown, what it adds to MLflow.

``flows.table`` names these in its rows (``preflight``, ``preview``, ``artifacts``); the checks,
``bertflow inspect`` and the stage task call them through the row, never by a stage's name.
Each imports its stage's package only when called.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import fsspec

from flows.calls import StageResult
from flows.presets import RunConfig
from pipeline.schema.manifest import read_manifest
from pipeline.schema.storage import join_url

log = logging.getLogger("bertflow.flow")


class BackendUnavailableError(OSError):
    """The configured training backend does not exist on this host."""


# -- preflight: (config, inputs) -> raise a one-line error, or the names of the inputs it checked ------
def check_data(cfg: RunConfig) -> None:
    """A preset that needs the user's corpora (``data.required``) has ``data.<source>`` set for
    every source of ``corpus.sources`` (wiki and books by default), and not to the deployments'
    ``CHANGE-ME`` placeholders."""
    if not cfg.data.required:
        return
    from pipeline.corpus.sources import SOURCES

    urls = cfg.data.source_urls()
    for name in cfg.corpus.sources:  # the sources the run reads: those must be the user's
        url, where = urls[name], cfg.data.source_field(name)
        if not url or "CHANGE-ME" in url:
            what = "is not set" if not url else f"is still the placeholder {url}"
            raise ValueError(
                f"{where}: the {cfg.preset} preset runs on the paper's data and {where} {what}; "
                f"--set {where}=URL with {SOURCES[name].hint}"
            )


def corpus_preflight(cfg: RunConfig, inputs: dict[str, str]) -> set[str]:
    """The corpora the run needs are set and hold files (``corpus.sources`` may leave one out, so
    this stage checks its own inputs)."""
    from pipeline.corpus.inputs import CorpusInputError, check_corpus_inputs

    check_data(cfg)
    try:
        check_corpus_inputs(cfg.corpus, inputs)
    except CorpusInputError as exc:
        raise FileNotFoundError(str(exc)) from None
    return set(inputs)


def check_backend(cfg: RunConfig) -> None:
    """The pretrain stage's backend exists here, decided in seconds: a CUDA device (and
    ``pretrain.nproc`` of them) for ``cuda``; ``torch_xla`` importable for ``xla`` (not imported)."""
    p = cfg.pretrain
    where = f"pretrain.backend={p.backend} (preset {cfg.preset}; $BERTFLOW_BACKEND picks it for base/large)"
    if p.backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"{where}, but torch {torch.__version__} sees no CUDA device on this host: run it on a GPU "
                "host (infra/gpu, the k8s-gpu pool), with the xla backend on a TPU VM (infra/tpu), or "
                "--set pretrain.backend=cpu for a (very slow) smoke run"
            )
        if p.nproc > torch.cuda.device_count():
            raise BackendUnavailableError(
                f"pretrain.nproc={p.nproc} processes but this host has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif p.backend == "xla":
        import importlib.util

        if importlib.util.find_spec("torch_xla") is None:
            raise BackendUnavailableError(
                f"{where}, but torch_xla is not importable here: install the xla extra on the TPU VM "
                "(infra/tpu/install.sh; torch==2.9.0 torch-xla[tpu]==2.9.0), or run on a GPU host with "
                "BERTFLOW_BACKEND=cuda"
            )


def segmenter_preflight(cfg: RunConfig, inputs: dict[str, str]) -> set[str]:
    """The 'cjk' extra is installed when the run segments Japanese or Chinese (vocab.word_tokenizer,
    examples.segmenter) or scores CMRC 2018 (nltk): in seconds, not when the stage starts."""
    import importlib.util

    needs = {
        "vocab.word_tokenizer": {"mecab": ("fugashi", "unidic_lite"), "jieba": ("jieba",)}.get(
            cfg.vocab.word_tokenizer, ()
        ),
        "examples.segmenter": {"fugashi": ("fugashi", "unidic_lite"), "jieba": ("jieba",)}.get(
            cfg.examples.segmenter, ()
        ),
        "finetune_tasks": ("nltk",) if "cmrc2018" in cfg.finetune_tasks else (),
    }
    for field, modules in needs.items():
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"{field}: needs {', '.join(missing)}, the 'cjk' extra: pip install 'bertflow[cjk]'")
    return set()


def backend_preflight(cfg: RunConfig, inputs: dict[str, str]) -> set[str]:
    """The backend exists here, and pretraining on the CPU fits this host's memory (an estimate:
    ``flows.sizes.check_training_memory``)."""
    from flows.sizes import available_memory, check_training_memory

    check_backend(cfg)
    check_training_memory(cfg, available_memory())
    return set()


def examples_preflight(cfg: RunConfig, inputs: dict[str, str]) -> set[str]:
    """The examples stage's output fits the disk under the root (an estimate from the corpus
    stage's characters, or before it ran from the raw inputs' sizes: ``flows.sizes``)."""
    from flows.presets import resolve_data
    from flows.sizes import check_examples_disk, free_disk, raw_chars
    from pipeline.schema.manifest import ManifestError

    corpus = inputs["corpus"]
    try:
        chars = float(read_manifest(corpus).counts.get("chars", 0.0))
        source = f"the corpus stage's count at {corpus}"
    except ManifestError:
        data = resolve_data(cfg.data)
        chars = raw_chars([getattr(data, name) for name in cfg.corpus.sources])
        source = "estimated from the raw inputs' sizes"
    where = corpus.rstrip("/").rsplit("/", 1)[0] if "/" in corpus.rstrip("/") else corpus
    check_examples_disk(cfg.examples, chars, free_disk(where), where, source)
    return set()


# -- preview: (stage folder, URL asked for, n) -> text -------------------------------------------------
def corpus_preview(folder: str, url: str, n: int) -> str:
    """Documents with their sentences (``corpus/wiki``, ``corpus/books``), or the rejects."""
    from pipeline.corpus.preview import format_preview, preview_corpus
    from pipeline.corpus.sources import CORPUS_SOURCES

    source = url.rstrip("/").rsplit("/", 1)[-1] if url.rstrip("/") != folder else None

    return format_preview(
        preview_corpus(folder, n, source=source if source in CORPUS_SOURCES else None, rejects=source == "rejects")
    )


def examples_preview(folder: str, url: str, n: int) -> str:
    """``[CLS] A [SEP] B [SEP]`` with each masked position as ``[MASK]→orig`` (or ``<shown>→orig``
    for the 10% random / 10% kept), of ``examples`` or one length (``examples/seq128``)."""
    from pipeline.examples.view import decode_examples
    from pipeline.schema.outputs import parse_seq_folder

    sub = url.rstrip("/").rsplit("/", 1)[-1]
    try:
        length = parse_seq_folder(sub)
    except ValueError:  # the stage folder itself: its first length
        length = None
    return "\n".join(decode_examples(folder, n, max_seq_length=length))


def vocab_preview(folder: str, url: str, n: int) -> str:
    with fsspec.open(join_url(folder, "vocab.txt"), "r") as f:
        return "\n".join(f.read().split("\n")[: max(n, 1)])


def model_preview(folder: str, url: str, n: int) -> str:
    with fsspec.open(join_url(folder, "config.json"), "r") as f:
        return f.read()


def counts_preview(folder: str, url: str, n: int) -> str:
    """The manifest's counts, and the first rows of the first predictions file (fine-tuning)."""
    manifest = read_manifest(folder)
    lines = [f"{k} = {v}" for k, v in sorted(manifest.counts.items())]
    for f in manifest.files:
        if f.path.startswith("predictions") or f.path.endswith(".tsv"):
            with fsspec.open(join_url(folder, f.path), "r") as fh:
                text = fh.read(200_000)
            if f.path.endswith(".json"):
                data = json.loads(text) if len(text) < 200_000 else {}
                head = list(data.items())[:n] if isinstance(data, dict) else data[:n]
                lines += [f"-- {f.path}"] + [json.dumps(x, ensure_ascii=False) for x in head]
            else:
                lines += [f"-- {f.path}"] + text.split("\n")[: n + 1]
            break
    return "\n".join(lines)


# -- artifacts: (tracker, run id, result) -> extra MLflow artifacts ------------------------------------
def vocab_artifact(tracker: Any, run_id: str, result: StageResult) -> None:
    with fsspec.open(join_url(result.url, "vocab.txt"), "r") as f:
        tracker.log_text(run_id, f.read(), "vocab.txt")


def corpus_sample_artifact(tracker: Any, run_id: str, result: StageResult) -> None:
    """A few documents, decoded (what ``bertflow inspect`` shows)."""
    tracker.log_text(run_id, corpus_preview(result.url, result.url, 5), "corpus_sample.txt")


def examples_sample_artifact(tracker: Any, run_id: str, result: StageResult) -> None:
    """A few examples with their masks visible (what ``bertflow inspect`` shows)."""
    tracker.log_text(run_id, examples_preview(result.url, result.url, 5), "examples_sample.txt")


def results_artifact(tracker: Any, run_id: str, result: StageResult) -> None:
    from flows.figures import format_figure

    rows = ["| metric | value |", "|---|---|"]
    rows += [f"| {k} | {format_figure(v)} |" for k, v in sorted(result.counts.items())]
    tracker.log_text(run_id, "\n".join(rows) + "\n", "results.md")


def loss_curve_artifact(tracker: Any, run_id: str, result: StageResult) -> None:
    """The loss curves the training process logged to this run, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    from pipeline.schema.objectives import OBJECTIVES

    sentence = sorted({f"{o.sentence_loss}_loss" for o in OBJECTIVES.values() if o.sentence_loss})
    for name in ("mlm_loss", *sentence, "eval_mlm_loss"):
        history = sorted(tracker.client.get_metric_history(run_id, name), key=lambda m: m.step)
        if history:
            ax.plot([m.step for m in history], [m.value for m in history], label=name)
            plotted = True
    if not plotted:
        plt.close(fig)
        return
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.set_title(f"pretraining: {result.url}")
    tracker.client.log_figure(run_id, fig, "loss_curve.png")
    plt.close(fig)
