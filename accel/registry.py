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

from accel import models, signals
from accel.config import Config
from accel.console import note
from accel.data import build_data, normalisation, to_unit_range
from accel.errors import ConfigError
from accel.reproduce import load_original
from accel.tracking.model import log_torch_model, served

DEFAULT_ALIAS = "champion"
MAX_NAME = 255  # characters: MLflow's limit for aliases; its SQL stores keep names in 256


@dataclass
class Registered:
    name: str
    version: str
    alias: str
    model_uri: str  # the logged model (models:/<model id>)
    serialization: str


def rebuild(tracker, run_id: str, cfg: Config):
    """The run's network with its best.pt weights as users call it (accel.tracking.model.served:
    [0, 1] images, normalised inside, class names in the metadata), and one input example (two
    validation images in [0, 1], float32 [2, C, H, W]): (module, example, metadata)."""
    import torch

    data = build_data(cfg, torch.device("cpu"))
    net = models.build_model(cfg, data.num_classes, data.in_chans, data.img_size)
    with tempfile.TemporaryDirectory(prefix="accel-") as tmp:
        try:
            path = tracker.client.download_artifacts(run_id, "checkpoint/best.pt", tmp)
        except Exception:
            raise ConfigError(f"run {run_id} has no checkpoint/best.pt (it ran with "
                              "tracking.log_checkpoint=false?): nothing to register") from None
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    mean, std = normalisation(cfg.data.dataset, data.in_chans)
    shape = (data.in_chans, data.img_size, data.img_size)
    module, metadata = served(net.eval(), data.classes, shape, mean, std)
    x, _ = next(iter(data.val))
    # Two images: with one, torch.export fixes the batch dimension at 1.
    return module, to_unit_range(x[:2].float(), cfg.data.dataset).numpy(), metadata


def log_model(tracker, run_id: str, cfg: Config) -> tuple[str, str]:
    """Log run_id's best weights as an MLflow PyTorch model in that run: (model URI, format)."""
    model, example, metadata = rebuild(tracker, run_id, cfg)
    return log_torch_model(tracker.uri, run_id, model, example, cfg.model.name, metadata)


def register(tracker, run_id: str, name: str, alias: str = DEFAULT_ALIAS,
             tags: dict[str, str] | None = None) -> Registered:
    """Log the run's model and register it as a new version of `name`, aliased `alias`."""
    import mlflow

    original = load_original(tracker, run_id)
    model_uri, serialization = log_model(tracker, run_id, original.config)
    all_tags = {"accel.run_id": run_id, "accel.serialization": serialization, **(tags or {})}
    version = None
    try:
        with signals.atomic():  # a stop inside waits: no version is left without its alias
            version = mlflow.register_model(model_uri, name, tags=all_tags)
            tracker.client.set_registered_model_alias(name, alias, version.version)
    except KeyboardInterrupt:
        signals.leave_behind(
            f"the model of run {run_id} was logged but not registered as {name}@{alias} (the "
            "run stays as it was): run the same command again" if version is None
            else _registered(name, alias, version.version, run_id))
        raise
    # Said only if a stop comes before the command has printed it: the registration is done.
    signals.leave_behind(_registered(name, alias, version.version, run_id))
    note(f"registered {name} version {version.version} ({serialization}) as {name}@{alias}")
    return Registered(name, str(version.version), alias, model_uri, serialization)


def _registered(name: str, alias: str, version: str, run_id: str) -> str:
    return (f"{name}@{alias} is version {version}, the model of run {run_id}: the "
            "registration was complete")


# What MLflow's registry accepts (mlflow.utils.validation), said in one line each; accel adds
# no '@' in names (models:/NAME@ALIAS) and no spaces at the ends.
NAME_RULE = ("a model name is not blank, '.' or '..'-prefixed, has no '/', ':' or '@' and "
             f"no spaces at the ends, at most {MAX_NAME} characters")
ALIAS_RULE = ("an alias is letters, digits, '_' and '-' (at most 255), not 'latest' nor "
              "v<number> (MLflow reserves them)")


def check_name(name: str, alias: str) -> None:
    """Names and aliases MLflow would refuse fail here, before anything is logged."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation

    checks = (("--register", name, NAME_RULE, (validation._validate_model_name,)),
              ("--alias", alias, ALIAS_RULE, (validation._validate_model_alias_name,
                                              validation._validate_model_alias_name_reserved)))
    for flag, value, rule, validators in checks:
        ok = value == value.strip() and "@" not in value and len(value) <= MAX_NAME
        try:
            for validate in validators:
                validate(value)
        except MlflowException:
            ok = False
        if not ok:
            raise ConfigError(f"{flag} {value!r}: {rule}")
