"""The winning model as an MLflow model: `accel best --study S --register NAME [--alias A]` logs
the best trial's weights (its `checkpoint/best.pt`) as an MLflow PyTorch model in the trial's run,
with a signature and an input example, registers it as a new version of NAME and points the alias
(default `champion`) at that version.

Serialization: `pt2` where `torch.export` traces the model, else `pickle`
(accel.tracking.model); the format is kept in the model version's `accel.serialization` tag.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from accel.config import Config
from accel.console import note
from accel.errors import ConfigError
from accel.reproduce import load_original
from accel.tracking.model import log_torch_model

DEFAULT_ALIAS = "champion"


@dataclass
class Registered:
    name: str
    version: str
    alias: str
    model_uri: str  # the logged model (models:/<model id>)
    serialization: str


def rebuild(tracker, run_id: str, cfg: Config):
    """The run's network with its best.pt weights, in eval mode on the CPU, and one input
    example (two validation images, float32 [2, C, H, W]) from the run's own data."""
    import torch

    from accel import models
    from accel.data import build_data

    data = build_data(cfg, torch.device("cpu"))
    model = models.build_model(cfg, data.num_classes, data.in_chans, data.img_size)
    with tempfile.TemporaryDirectory(prefix="accel-") as tmp:
        try:
            path = tracker.client.download_artifacts(run_id, "checkpoint/best.pt", tmp)
        except Exception:
            raise ConfigError(f"run {run_id} has no checkpoint/best.pt (it ran with "
                              "tracking.log_checkpoint=false?): nothing to register") from None
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.eval()
    x, _ = next(iter(data.val))
    # Two images: with one, torch.export fixes the batch dimension at 1.
    return model, x[:2].float().numpy()


def log_model(tracker, run_id: str, cfg: Config) -> tuple[str, str]:
    """Log run_id's best weights as an MLflow PyTorch model in that run: (model URI, format)."""
    model, example = rebuild(tracker, run_id, cfg)
    return log_torch_model(tracker.uri, run_id, model, example, cfg.model.name)


def register(tracker, run_id: str, name: str, alias: str = DEFAULT_ALIAS,
             tags: dict[str, str] | None = None) -> Registered:
    """Log the run's model and register it as a new version of `name`, aliased `alias`."""
    import mlflow

    original = load_original(tracker, run_id)
    model_uri, serialization = log_model(tracker, run_id, original.config)
    all_tags = {"accel.run_id": run_id, "accel.serialization": serialization, **(tags or {})}
    version = mlflow.register_model(model_uri, name, tags=all_tags)
    tracker.client.set_registered_model_alias(name, alias, version.version)
    note(f"registered {name} version {version.version} ({serialization}) as {name}@{alias}")
    return Registered(name, str(version.version), alias, model_uri, serialization)


def check_name(name: str, alias: str) -> None:
    """Bad names fail before anything is logged."""
    for what, value in (("--register", name), ("--alias", alias)):
        if not value or value != value.strip() or "/" in value or "@" in value:
            raise ConfigError(f"{what} {value!r}: a name without spaces at the ends, '/' or '@'")
    if alias.lower().startswith("v") and alias[1:].isdigit():
        raise ConfigError(f"--alias {alias!r}: names like v1 are reserved for versions")

