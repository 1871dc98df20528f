"""`accel evaluate MODEL_URI [CONFIG] [KEY=VALUE ...]`: load a model through MLflow, evaluate it on
a test split, log the evaluation as a run, print the table.

MODEL_URI is `models:/NAME@ALIAS`, `models:/NAME/VERSION` or `runs:/RUN_ID/model`. The data is
the config given, else the config of the run that logged the model (its own data set: the test
split where there is one, else its validation split); KEY=VALUE overrides apply on top
(`data.dataset=imagefolder data.root=DIR` evaluates on any ImageFolder). The run is tagged
`accel.role=evaluate` and `accel.evaluates=<MODEL_URI>`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from accel import config, signals
from accel.config import Config
from accel.console import fmt
from accel.errors import ConfigError, one_line
from accel.reproduce import load_original
from accel.tracking import retry_locked
from accel.tracking.lineage import CONTEXTS, log_splits
from accel.tracking.model import METADATA_CLASSES, METADATA_INPUT, SERVED_INPUT
from accel.tracking.store import open_store
from accel.uris import redact, with_driver

URI_FORMS = "models:/NAME@ALIAS, models:/NAME/VERSION or runs:/RUN_ID/model"


def source_run(tracker, uri: str) -> str:
    """The id of the run that logged the model at `uri` (bad URI, name or alias: ConfigError)."""
    from mlflow.exceptions import MlflowException

    client = tracker.client
    try:
        if uri.startswith("runs:/"):
            return uri.removeprefix("runs:/").split("/", 1)[0]
        if not uri.startswith("models:/"):
            raise ConfigError(f"model URI {uri!r}: use {URI_FORMS}")
        ref = uri.removeprefix("models:/")
        if "@" in ref:
            name, alias = ref.split("@", 1)
            version = client.get_model_version_by_alias(name, alias)
        elif ref.count("/") == 1:
            version = client.get_model_version(*ref.split("/"))
        else:
            raise ConfigError(f"model URI {uri!r}: use {URI_FORMS}")
    except MlflowException as e:
        known = _known(client, uri.removeprefix("models:/")) if uri.startswith("models:/") else ""
        raise ConfigError(f"model {uri}: {one_line(e)}{known}") from None
    if not version.run_id:
        raise ConfigError(f"model {uri} was not logged by a run: give a config for its data")
    return version.run_id


def _known(client, ref: str) -> str:
    """What the registry holds, for a name or alias that is not there: the model's aliases and
    versions, or the registered models' names."""
    from mlflow.exceptions import MlflowException

    name = ref.split("@", 1)[0].split("/", 1)[0]
    try:
        model = client.get_registered_model(name)
    except MlflowException:
        names = sorted(m.name for m in client.search_registered_models(max_results=100))
        return f"; registered models: {', '.join(names) or 'none'}"
    aliases = ", ".join(f"@{a} (version {v})" for a, v in sorted(model.aliases.items()))
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    return (f"; {name} has aliases {aliases or 'none'} and versions "
            f"{', '.join(map(str, versions)) or 'none'}")


def load(uri: str):
    """(the model, through MLflow, on the CPU; its metadata: {} for a model logged before it
    carried its classes and took [0, 1] images)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        model = mlflow.pytorch.load_model(uri, map_location="cpu")
        return model, mlflow.models.get_model_info(uri).metadata or {}
    except (MlflowException, OSError) as e:
        raise ConfigError(f"cannot load model {uri}: {one_line(e)}") from None


@dataclass
class Evaluation:
    split: str  # "test", or "val" where the data has no test split
    metrics: dict[str, float]
    classes: list[str]
    confusion_matrix: Any
    lineage: dict  # the split's record (accel.tracking.lineage)


@dataclass
class _Job:
    """What is scored, checked before any run opens."""
    model: Any
    split: str
    loader: Any
    classes: list[str]
    data: Any


def evaluate(model, cfg: Config, metadata: dict | None = None,
             split: str | None = None) -> Evaluation:
    """`model` on one split of cfg's data (accel.data.build_eval_data: its test split where
    there is one)."""
    return score(prepare(model, cfg, metadata or {}, split), cfg)


def prepare(model, cfg: Config, metadata: dict, split: str | None = None) -> _Job:
    """The data and the model ready to score; data the model cannot take: ConfigError."""
    import torch

    from accel.data import build_eval_data

    shape = metadata.get("input_shape")
    data = build_eval_data(cfg, torch.device("cpu"), size=shape[-1] if shape else None,
                           split=split)
    split, loader = next((s, getattr(data, s)) for s in ("test", "val", "train")
                         if getattr(data, s) is not None)
    model = _Evaluable(model, cfg.data.dataset if _takes_unit_range(metadata) else None)
    # Two images, not a batch: a check that need not read the split.
    x = torch.stack([loader.dataset[i][0] for i in range(min(2, len(loader.dataset)))])
    if shape and tuple(x.shape[1:]) != tuple(shape[1:]):
        at = f" in {cfg.data.root}" if cfg.data.dataset == "imagefolder" else ""
        raise ConfigError(f"the model takes images of {_shape(shape[1:])}; the "
                          f"{cfg.data.dataset} data{at} gives {_shape(x.shape[1:])}")
    try:
        with torch.no_grad():
            outputs = model(x[:2].float()).shape[-1]
    # Another channel count or image size (an exported pt2 program's shape guards raise
    # AssertionError).
    except (RuntimeError, ValueError, AssertionError) as e:
        raise ConfigError(f"the model cannot take {cfg.data.dataset} images of shape "
                          f"{tuple(x.shape[1:])}: {one_line(e)[:160]}") from None
    classes = _align(loader.dataset, metadata.get(METADATA_CLASSES), data.classes)
    if outputs != len(classes):
        raise ConfigError(f"the model predicts {outputs} classes, {cfg.data.dataset} "
                          f"({cfg.data.root}) has {len(classes)}: wrong data for this model")
    return _Job(model, split, loader, classes, data)


def _shape(chw) -> str:
    c, h, w = chw
    return f"{c} channel{'s' if c != 1 else ''} of {h}x{w} px"


def score(job: _Job, cfg: Config) -> Evaluation:
    import torch

    from accel.engine import create_evaluator
    from accel.train.run_log import data_records

    evaluator = create_evaluator(job.model, len(job.classes), torch.device("cpu"),
                                 tta=cfg.eval.tta)  # scored as the run scored it
    m = evaluator.run(job.loader).metrics
    matrix, split = m["confusion_matrix"], job.split
    per_class = (matrix.diag() / matrix.sum(dim=1).clamp(min=1)).tolist()
    metrics = {f"{split}_accuracy": m["accuracy"], f"{split}_f1": float(m["f1"]),
               f"{split}_loss": m["loss"], "images": float(matrix.sum())}
    present = matrix.sum(dim=1) > 0  # a folder may hold some of the model's classes only
    metrics.update({f"{split}_class_accuracy.{c}": a for c, a, seen in
                    zip(job.classes, per_class, present.tolist(), strict=True) if seen})
    # After scoring: the record reads the files the evaluation has just read.
    lineage = next(r for r in data_records(cfg, job.data) if r["context"] == CONTEXTS[split])
    return Evaluation(split, metrics, job.classes, matrix, lineage)


def _takes_unit_range(metadata: dict) -> bool:
    return metadata.get(METADATA_INPUT) == SERVED_INPUT


def _align(dataset, model_classes: list[str] | None, data_classes: list[str]) -> list[str]:
    """The classes scored: the model's, where it names them. A folder's labels (its own
    sorted class folders, maybe fewer) are mapped to the model's; an unknown class is refused."""
    if not model_classes:
        return data_classes
    unknown = sorted(set(data_classes) - set(model_classes))
    if unknown:
        raise ConfigError(f"the data has classes the model does not know: {', '.join(unknown)} "
                          f"(it knows {', '.join(model_classes)})")
    if hasattr(dataset, "class_to_idx"):  # an ImageFolder: labels of its own listing
        index = [model_classes.index(c) for c in dataset.classes]
        dataset.target_transform = index.__getitem__
    return list(model_classes)


class _Evaluable:
    """An exported (pt2) program cannot be switched to eval mode; it already is: `eval()` is
    then a no-op. A model that normalises inside gets the data's batches as [0, 1] images
    (`unit_range`: the dataset they are normalised as). Anything else is called as is."""

    def __init__(self, model, unit_range: str | None = None):
        self.model, self.unit_range = model, unit_range

    def eval(self):
        # torch.export modules refuse train()/eval(): they were traced in eval mode
        with contextlib.suppress(NotImplementedError, RuntimeError):
            self.model.eval()
        return self

    def __call__(self, x):
        if self.unit_range is not None:
            from accel.data import to_unit_range

            x = to_unit_range(x, self.unit_range)
        return self.model(x)


def cli_evaluate(args, overrides: list[str]) -> int:
    import mlflow

    uri = args.model_uri
    tracker = open_store(args.tracking_uri)
    mlflow.set_tracking_uri(with_driver(tracker.uri))
    run_id = source_run(tracker, uri)
    cfg = _config(tracker, run_id, args.config, overrides)
    model, metadata = load(uri)
    job = prepare(model, cfg, metadata, args.split)  # bad data: one line, before any run
    run, done = _tracked(tracker, uri, run_id, cfg, job)
    print(table(uri, done.split, cfg, done.metrics))
    print(f"mlflow run: {run} ({redact(tracker.uri)})")
    return 0


def _config(tracker, run_id: str, path: str | None, overrides: list[str]) -> Config:
    """The config given, else the data the model was trained on, with the overrides."""
    if path:
        return config.load(path, overrides)
    cfg = load_original(tracker, run_id).config
    for item in overrides:
        config.set_key(cfg, *config.parse_override(item))
    config.validate(cfg)
    return cfg


def _tracked(tracker, uri: str, run_id: str, cfg: Config, job: _Job) -> tuple[str, Evaluation]:
    """Score inside an evaluation run: FINISHED, KILLED on Ctrl-C or SIGTERM, else FAILED."""
    from accel.train.run_log import log_confusion_matrix  # Ignite: loaded when scoring

    run, status = None, "FAILED"
    try:
        with signals.deferred_stops():  # a stop while the run is made: it still ends KILLED
            run = tracker.start_run(cfg.tracking.experiment or cfg.name,
                                    f"evaluate-{_short(uri)}",
                                    tags={"accel.role": "evaluate", "accel.evaluates": uri,
                                          "accel.model_run_id": run_id})
        tracker.log_config(run, cfg)
        done = score(job, cfg)
        tracker.log_metrics(run, done.metrics, step=0)
        log_splits(tracker.client, run, [done.lineage])
        log_confusion_matrix(tracker, run, done.confusion_matrix, done.classes)
        status = "FINISHED"
        return run, done
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if run is not None:
            retry_locked(tracker.end_run, run, status)


def _short(uri: str) -> str:
    return uri.split(":/", 1)[-1].replace("/", "-").replace("@", "-")[:60]


def table(uri: str, split: str, cfg: Config, metrics: dict[str, float]) -> str:
    rows = [(k.removeprefix(f"{split}_"), fmt(v)) for k, v in metrics.items() if k != "images"]
    width = max(len(k) for k, _ in rows)
    head = (f"{uri} on {cfg.data.dataset} ({split} split, {int(metrics['images'])} images)")
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])
