"""A trained network as an MLflow PyTorch model, logged into a run (`name="model"`), with a
signature and an input example.

Serialization: `pt2` (`torch.export`, MLflow 3's default): the saved program loads without accel,
timm or unpickling code. Where `torch.export` cannot trace a model, `pickle` (the module itself,
which needs timm to load and runs code when loaded: load only models you trust) is used instead,
with a warning.
"""

from __future__ import annotations

from accel.console import warn
from accel.errors import one_line
from accel.uris import with_driver

MODEL_NAME = "model"  # the logged model's name in its run


def log_torch_model(tracking_uri: str, run_id: str, model, example, label: str
                    ) -> tuple[str, str]:
    """Log `model` (eval mode, CPU) into `run_id`: (model URI, serialization). `example` is a
    float32 NumPy batch of two inputs: with one, torch.export fixes the batch size at 1."""
    import mlflow
    import torch
    from mlflow.models import infer_signature

    with torch.no_grad():
        signature = infer_signature(example, model(torch.from_numpy(example)).numpy())
    mlflow.set_tracking_uri(with_driver(tracking_uri))
    with mlflow.start_run(run_id=run_id):
        for serialization in ("pt2", "pickle"):
            try:
                info = mlflow.pytorch.log_model(
                    model, name=MODEL_NAME, input_example=example, signature=signature,
                    serialization_format=serialization, pip_requirements=_requirements())
                return info.model_uri, serialization
            except Exception as e:
                if serialization == "pickle":
                    raise
                warn(f"torch.export cannot trace {label} ({one_line(e)[:150]}); logging it "
                     "pickled instead (loading it needs timm and runs code)")
    raise AssertionError("unreachable")


def _requirements() -> list[str]:
    """Pinned to what trained it; without this MLflow infers them by importing the model."""
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in ("torch", "torchvision", "timm")]
