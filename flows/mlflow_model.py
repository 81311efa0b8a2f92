"""The export as an MLflow model that loads anywhere: ``flows/served_model.py`` as models-from-code.

Logged with no pickle: MLflow stores the model's code (``flows/served_model.py``) and runs it at
load time; ``model/`` and ``pipeline/`` ship as ``code_paths``; the Hugging Face folder is the
one artifact (``hf_model``: the weights, stored once, which also load in ``transformers``); the
requirements are what that code imports, pinned to the versions that logged it.

Its signature (what MLflow's UI lists as Inputs and Outputs, and what ``mlflow models serve``
checks a request against) is one *unnamed* column, not a column named ``text``: MLflow
enforces a named column on every input, and a list of strings or a single string (both of which
the served model documents) have none, so they would be refused; an unnamed column takes a
DataFrame's first column, a list and a string alike. Its type is ``Any``, not ``string``: with a
string column, ``mlflow models serve`` casts the request to strings before the model sees it, so
``{"inputs": [1, 2]}`` was answered as the texts "1" and "2"; the served model checks each value
itself and refuses what is not text (``flows/served_model.py``). The outputs: ``text``, ``filled`` (the top
token of each ``[MASK]``), ``cls_embedding`` and ``mean_embedding`` (floats), ``windows``. The
input example is one masked sentence, stored with the model (MLflow runs it once at logging, so
a model that cannot load or answer fails there, not in serving).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

SERVED_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "served_model.py")
REQUIREMENTS = ("torch", "safetensors", "tokenizers", "pandas", "numpy", "pyarrow", "fsspec")
"""What ``served_model.py`` and the shipped ``model/`` and ``pipeline/schema/`` import."""


def requirements() -> list[str]:
    """The served model's requirements, pinned to what is installed here (torch's CPU or CUDA
    local version label dropped: pip resolves the right build where it is installed)."""
    pins = []
    for name in REQUIREMENTS:
        version = importlib.metadata.version(name).split("+", 1)[0]
        pins.append(f"{name}=={version}")
    return pins


INPUT_EXAMPLE = ["the [MASK] of the river"]


def signature():
    """The served model's signature: one unnamed column of any type in, a row per text out."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, Array, ColSpec, Schema

    outputs = [
        ColSpec("string", "text"),
        ColSpec(Array("string"), "filled"),
        ColSpec(Array("double"), "cls_embedding"),
        ColSpec(Array("double"), "mean_embedding"),
        ColSpec("long", "windows"),
    ]
    return ModelSignature(inputs=Schema([ColSpec(AnyType())]), outputs=Schema(outputs))


def _package_dir(name: str) -> str:
    return os.path.dirname(importlib.util.find_spec(name).origin)


def log_bert_model(run_id: str, hf_folder: str):
    """Log ``hf_folder`` as the pyfunc model ``model`` of run ``run_id``; returns MLflow's ModelInfo."""
    import mlflow

    with mlflow.start_run(run_id=run_id, nested=True):
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=SERVED_MODEL,
            artifacts={"hf_model": hf_folder},
            pip_requirements=requirements(),
            code_paths=[_package_dir("model"), _package_dir("pipeline")],
            signature=signature(),
            input_example=INPUT_EXAMPLE,
        )
