"""A trained network as an MLflow PyTorch model, logged into a run (`name="model"`), with a
signature and an input example.

The served form (`served`) takes images as users have them: float32 NCHW in [0, 1] at the
trained size. It normalises inside the module with the training data's mean and std, and its
class names are in the model's metadata (`METADATA_CLASSES`).

The run is never reopened: the model is created in the run's experiment with the run as its
source, so stopping here (Ctrl-C, SIGTERM, SIGKILL) leaves the run's status as it was.

Serialization: `pt2` (`torch.export`, MLflow 3's default): the saved program loads without accel,
timm or unpickling code. Where `torch.export` cannot trace a model, `pickle` (the module itself,
which needs timm to load and runs code when loaded: load only models you trust) is used instead,
with a warning.
"""

from __future__ import annotations

import torch

from accel import signals
from accel.console import warn
from accel.errors import one_line
from accel.tracking.client import retry_locked
from accel.uris import with_driver

MODEL_NAME = "model"  # the logged model's name in its run
METADATA_CLASSES = "classes"  # class names, in the order of the model's outputs
METADATA_INPUT = "input"  # what the model takes, e.g. "float32 NCHW [0, 1]"
SERVED_INPUT = "float32 NCHW [0, 1]"
METADATA_RANGE = "input_range"  # how it reads values outside [0, 1]
SERVED_RANGE = "an image with any value above 1 is read as 0-255 pixels and divided by 255"


class ToUnitRange(torch.nn.Module):
    """Passes [0, 1] images through and divides an image whose values exceed 1 (0-255 pixels,
    as image files hold them) by 255, per image: either way a caller sends a picture, it is
    classified as the same picture. No Python branch on the data: torch.export traces it into
    the program (and the pickled fallback finds this class in accel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        over = x.flatten(1).amax(dim=1) > 1.0
        scale = torch.where(over, torch.full_like(over, 255.0, dtype=x.dtype),
                            torch.ones_like(over, dtype=x.dtype))
        return x / scale.view(-1, *([1] * (x.dim() - 1)))


def served(net, classes: list[str], shape: tuple[int, int, int], mean, std):
    """(module, metadata) of `net` as users call it: [0, 1] images of `shape` (C, H, W),
    normalised inside with the training data's `mean`/`std`, eval mode, CPU."""
    import torch
    from torchvision.transforms import v2

    # torchvision's Normalize: the pickled fallback loads without accel; torch.export traces it
    # into the program.
    module = torch.nn.Sequential(ToUnitRange(), v2.Normalize(list(mean), list(std)),
                                 net).cpu().eval()
    metadata = {METADATA_CLASSES: list(classes), METADATA_INPUT: SERVED_INPUT,
                METADATA_RANGE: SERVED_RANGE, "input_shape": [-1, *shape], "mean": list(mean),
                "std": list(std)}
    return module, metadata


def log_torch_model(tracking_uri: str, run_id: str, model, example, label: str,
                    metadata: dict | None = None) -> tuple[str, str]:
    """Log `model` (eval mode, CPU) into `run_id`, which stays as it is (not reopened): (model
    URI, serialization). `example` is a float32 NumPy batch of two inputs: with one,
    torch.export fixes the batch size at 1."""
    import mlflow
    import torch
    from mlflow.models import infer_signature

    with torch.no_grad():
        signature = infer_signature(example, model(torch.from_numpy(example)).numpy())
    mlflow.set_tracking_uri(with_driver(tracking_uri))
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    # Created here, in the run's experiment: without an active run MLflow would put it in the
    # Default experiment, where runs:/RUN_ID/model does not find it.
    logged = client.create_logged_model(run.info.experiment_id, name=MODEL_NAME,
                                        source_run_id=run_id, params=run.data.params)
    try:
        # MLflow's own store writes inside log_model are not accel's: a stop cutting one in
        # half leaves SQLite locked, and marking the model FAILED then waits out the lock. A
        # stop during the logging is raised when it is done, and the model is marked FAILED.
        with signals.atomic():
            for serialization in ("pt2", "pickle"):
                try:
                    info = mlflow.pytorch.log_model(
                        model, name=MODEL_NAME, model_id=logged.model_id, run_id=run_id,
                        input_example=example, signature=signature, metadata=metadata,
                        serialization_format=serialization, pip_requirements=_requirements())
                    client.set_logged_model_tags(logged.model_id,
                                                 {"accel.serialization": serialization})
                    return info.model_uri, serialization
                except Exception as e:
                    if serialization == "pickle":
                        raise
                    warn(f"torch.export cannot trace {label} ({one_line(e)[:150]}); logging "
                         "it pickled instead (loading it needs timm and runs code)")
    except BaseException as e:  # an error or a stop: the half-logged model says so
        try:  # a stop inside a store call can leave SQLite locked for a moment
            retry_locked(client.finalize_logged_model, logged.model_id, "FAILED")
        except Exception as failed:  # it must not hide the error or the stop that ended it
            warn(f"model {logged.model_id} could not be marked FAILED: {one_line(failed)}")
        if isinstance(e, KeyboardInterrupt) or signals.stop_requested():
            signals.leave_behind(f"the model being logged into run {run_id} was marked FAILED "
                                 "(the run stays as it was): run the same command again")
            if not isinstance(e, KeyboardInterrupt):  # the stop landed inside MLflow's code
                raise KeyboardInterrupt from e
        raise
    raise AssertionError("unreachable")


def _requirements() -> list[str]:
    """Pinned to what trained it; without this MLflow infers them by importing the model."""
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in ("torch", "torchvision", "timm")]
