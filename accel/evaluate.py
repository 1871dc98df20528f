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

from accel.config import Config
from accel.console import fmt
from accel.errors import ConfigError, one_line
from accel.tracking.lineage import CONTEXTS
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
        raise ConfigError(f"model {uri}: {one_line(e)}") from None
    if not version.run_id:
        raise ConfigError(f"model {uri} was not logged by a run: give a config for its data")
    return version.run_id


def load(uri: str):
    """The model, through MLflow, on the CPU."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.pytorch.load_model(uri, map_location="cpu")
    except (MlflowException, OSError) as e:
        raise ConfigError(f"cannot load model {uri}: {one_line(e)}") from None


@dataclass
class Evaluation:
    split: str  # "test", or "val" where the data has no test split
    metrics: dict[str, float]
    classes: list[str]
    confusion_matrix: Any
    lineage: dict  # the split's record (accel.tracking.lineage)


def evaluate(model, cfg: Config) -> Evaluation:
    """`model` on the test split of cfg's data (its validation split where there is none)."""
    import torch

    from accel.data import build_data
    from accel.engine import create_evaluator
    from accel.train.run_log import data_records

    data = build_data(cfg, torch.device("cpu"))
    split, loader = ("test", data.test) if data.test is not None else ("val", data.val)
    x, _ = next(iter(loader))
    try:
        with torch.no_grad():
            outputs = model(x[:2].float()).shape[-1]
    # Another channel count or image size (an exported pt2 program's shape guards raise
    # AssertionError).
    except (RuntimeError, ValueError, AssertionError) as e:
        raise ConfigError(f"the model cannot take {cfg.data.dataset} images of shape "
                          f"{tuple(x.shape[1:])}: {one_line(e)[:160]}") from None
    if outputs != data.num_classes:
        raise ConfigError(f"the model predicts {outputs} classes, {cfg.data.dataset} "
                          f"({cfg.data.root}) has {data.num_classes}: wrong data for this model")
    evaluator = create_evaluator(_Evaluable(model), data.num_classes, torch.device("cpu"),
                                 tta=cfg.eval.tta)  # scored as the run scored it
    m = evaluator.run(loader).metrics
    matrix = m["confusion_matrix"]
    per_class = (matrix.diag() / matrix.sum(dim=1).clamp(min=1)).tolist()
    metrics = {f"{split}_accuracy": m["accuracy"], f"{split}_f1": float(m["f1"]),
               f"{split}_loss": m["loss"], "images": float(matrix.sum())}
    metrics.update({f"{split}_class_accuracy.{c}": a for c, a in zip(data.classes, per_class,
                                                                      strict=True)})
    lineage = next(r for r in data_records(cfg, data) if r["context"] == CONTEXTS[split])
    return Evaluation(split, metrics, data.classes, matrix, lineage)


class _Evaluable:
    """An exported (pt2) program cannot be switched to eval mode; it already is: `eval()` is
    then a no-op. Anything else is called as is."""

    def __init__(self, model):
        self.model = model

    def eval(self):
        # torch.export modules refuse train()/eval(): they were traced in eval mode
        with contextlib.suppress(NotImplementedError, RuntimeError):
            self.model.eval()
        return self

    def __call__(self, x):
        return self.model(x)


def cli_evaluate(args, overrides: list[str]) -> int:
    import mlflow

    from accel import config
    from accel.reproduce import load_original
    from accel.tracking.lineage import log_splits
    from accel.train.run_log import log_confusion_matrix

    uri = args.model_uri
    tracker = open_store(args.tracking_uri)
    mlflow.set_tracking_uri(with_driver(tracker.uri))
    run_id = source_run(tracker, uri)
    if args.config:
        cfg = config.load(args.config, overrides)
    else:  # the data the model was trained on, unless overridden
        cfg = load_original(tracker, run_id).config
        for item in overrides:
            config.set_key(cfg, *config.parse_override(item))
        config.validate(cfg)
    done = evaluate(load(uri), cfg)
    run = tracker.start_run(cfg.tracking.experiment or cfg.name, f"evaluate-{_short(uri)}",
                            tags={"accel.role": "evaluate", "accel.evaluates": uri,
                                  "accel.model_run_id": run_id})
    tracker.log_config(run, cfg)
    tracker.log_metrics(run, done.metrics, step=0)
    log_splits(tracker.client, run, [done.lineage])
    log_confusion_matrix(tracker, run, done.confusion_matrix, done.classes)
    tracker.end_run(run, "FINISHED")
    print(table(uri, done.split, cfg, done.metrics))
    print(f"mlflow run: {run} ({redact(tracker.uri)})")
    return 0


def _short(uri: str) -> str:
    return uri.split(":/", 1)[-1].replace("/", "-").replace("@", "-")[:60]


def table(uri: str, split: str, cfg: Config, metrics: dict[str, float]) -> str:
    rows = [(k.removeprefix(f"{split}_"), fmt(v)) for k, v in metrics.items() if k != "images"]
    width = max(len(k) for k, _ in rows)
    head = (f"{uri} on {cfg.data.dataset} ({split} split, {int(metrics['images'])} images)")
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])
