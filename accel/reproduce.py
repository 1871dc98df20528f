"""`accel reproduce RUN_ID`: rebuild a run's config from what MLflow logged, rerun it, compare.

The config comes from the run's `config.yaml` artifact, or, where that is gone (a store copied
without its artifacts, a deleted file), from the logged params cast back through the config
schema. Each rerun is a new run in the same experiment, tagged `accel.reproduces=<RUN_ID>`
(in a copied store whose experiment folder is not on this machine: a sibling experiment, below).
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from accel import config
from accel.config import Config, ConfigError

# Params that train() logs beside the config keys: derived values, not settings to rebuild.
DERIVED_PARAMS = ("effective_batch_size",)
DERIVED_PREFIXES = ("resolved.",)
SPACE_KEY = "search.space"
# Environment entries that differ on purpose between the original and a rerun.
ENV_IGNORED = ("seed",)
TABLE_METRICS = ("val_accuracy", "val_f1", "val_loss", "test_accuracy")
TIME_METRIC = "epoch_time_s"
EXIT_NOT_REPRODUCED = 3
SIBLING_SUFFIX = "-reproduced"


@dataclass
class Original:
    """What MLflow holds about the run to reproduce."""

    run_id: str
    experiment: str
    rerun_experiment: str  # the same experiment, unless its artifact folder is not here
    status: str
    config: Config
    source: str  # "config.yaml" or "params"
    metrics: dict[str, float]  # final (latest-step) values
    epoch_time_s: float | None  # median over the logged epochs
    environment: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)  # warnings to print before training


def warn(message: str) -> None:
    print(f"accel: warning: {message}", file=sys.stderr)


def note(message: str) -> None:
    print(f"accel: {message}", file=sys.stderr)


# --- the store and the run ------------------------------------------------------------------


def open_store(uri: str | None):
    """A Tracker on an existing store; a missing or unreachable store is a ConfigError."""
    from accel.tracking import Tracker, redact, resolve_uri

    uri = resolve_uri(uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        # MLflow would silently create an empty database here; say the store is missing instead.
        if not db.is_file():
            raise ConfigError(
                f"no MLflow store at {db} (from --tracking-uri {redact(uri)}); "
                "give the sqlite:///path/to/mlflow.db that holds the run"
            )
    elif uri.startswith(("http://", "https://")):
        _probe_server(uri)
    return Tracker(uri)


def _probe_server(uri: str, timeout_s: float = 10.0) -> None:
    """Fail fast: MLflow's own client retries a dead server for minutes before giving up."""
    import urllib.error
    import urllib.request

    from accel.tracking import redact

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        pass  # the server answered, even if not with 200: it is reachable
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"cannot reach the MLflow server at {redact(uri)}: {reason}") from None


def fetch_run(tracker, run_id: str):
    from mlflow.exceptions import MlflowException

    from accel.tracking import redact

    try:
        return tracker.client.get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ConfigError(
                f"no run '{run_id}' in the MLflow store {redact(tracker.uri)}; "
                "copy the run id from `accel best` or the MLflow UI"
            ) from None
        raise ConfigError(
            f"cannot read run '{run_id}' from {redact(tracker.uri)}: {_first_line(e)}"
        ) from None
    except Exception as e:  # a database that refuses the connection, a bad URL, ...
        raise ConfigError(
            f"cannot read the MLflow store {redact(tracker.uri)}: {_first_line(e)}"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _local_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None


def local_artifact_dir(tracker, run, experiment) -> tuple[Path | None, str | None]:
    """The run's artifact folder on this disk, if its artifacts are local files.

    Returns (folder or None, a note). The logged location is an absolute path; where a copied
    store no longer finds it, the same layout under this store's own artifact root is tried
    (`sqlite:///X/mlflow.db` keeps artifacts in `X/artifacts/<experiment>/<run>/artifacts`).
    """
    logged = _local_path(run.info.artifact_uri)
    if logged is None:
        return None, None  # a server or object store: artifacts are downloaded instead
    if logged.is_dir():
        return logged, None
    root = _local_path(experiment.artifact_location)
    if tracker.artifact_root and root is not None:
        try:
            relative = logged.relative_to(root.parent)
        except ValueError:
            relative = None
        if relative is not None:
            moved = _local_path(tracker.artifact_root) / relative
            if moved.is_dir():
                return moved, (
                    f"artifacts not at the logged {logged}; using the copy beside "
                    f"this store, {moved}"
                )
    return None, f"the run's artifacts are not on this machine (logged at {logged})"


def rerun_experiment(experiment) -> tuple[str, str | None]:
    """Where reruns are logged, and a note when that is not the original's experiment.

    MLflow fixes a run's artifact folder from its experiment's absolute location. In a store
    copied from another machine that folder does not exist here (and may not be creatable), so
    reruns would write outside the store or fail; they go to a sibling experiment of this store.
    """
    location = _local_path(experiment.artifact_location)
    if location is None or location.is_dir():
        return experiment.name, None
    sibling = experiment.name + SIBLING_SUFFIX
    return sibling, (
        f"experiment {experiment.name!r} keeps artifacts in {location}, which is "
        f"not on this machine; reruns are logged to experiment {sibling!r}"
    )


def read_artifact(tracker, run, local_dir: Path | None, name: str) -> str | None:
    """The text of artifact `name`, or None where it does not exist or cannot be fetched."""
    if _local_path(run.info.artifact_uri) is not None:
        path = local_dir / name if local_dir else None
        return path.read_text() if path and path.is_file() else None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="accel-") as tmp:
        try:
            return Path(tracker.client.download_artifacts(run.info.run_id, name, tmp)).read_text()
        except Exception:  # missing artifact, or the artifact store is unreachable
            return None


# --- rebuilding the config ------------------------------------------------------------------


def _literal(text: str) -> Any:
    """Invert `str(value)` as tracking logs it: None is "null", lists and bools are reprs."""
    if text == "null":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _space_from_params(items: dict[str, str]) -> dict[str, Any]:
    """Undo the flattening of `search.space` (`search.space.train.lr.low` -> {"train.lr": ...}).

    Space entries are named by dotted config keys, so the longest config key that prefixes a
    param names the entry and the rest is the path inside it.
    """
    keys = sorted(config.all_keys(), key=len, reverse=True)
    space: dict[str, Any] = {}
    for flat, text in items.items():
        rest = flat[len(SPACE_KEY) + 1 :]
        name = next((k for k in keys if rest == k or rest.startswith(k + ".")), None)
        path = [name, *rest[len(name) + 1 :].split(".")] if name else rest.split(".")
        path = [p for p in path if p]
        node = space
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _literal(text)
    return space


def config_from_params(params: dict[str, str]) -> tuple[Config, list[str]]:
    """Rebuild the config from logged params (all strings); returns it and what did not fit."""
    cfg, notes = Config(), []
    settings = {
        k: v
        for k, v in params.items()
        if k not in DERIVED_PARAMS and not k.startswith(DERIVED_PREFIXES)
    }
    space = {k: v for k, v in settings.items() if k.startswith(SPACE_KEY + ".")}
    unknown = []
    for key, value in settings.items():
        if key in space:
            continue
        try:
            config.set_key(cfg, key, value)
        except ConfigError as e:
            if not str(e).startswith("unknown config key"):
                raise ConfigError(f"logged param {key}={value!r} does not fit: {e}") from None
            unknown.append(key)
    if space:
        config.set_key(cfg, SPACE_KEY, _space_from_params(space))
    missing = [k for k in config.all_keys() if k not in settings and not (k == SPACE_KEY and space)]
    if unknown:
        notes.append(f"logged params unknown to this config schema, ignored: {', '.join(unknown)}")
    if missing:
        notes.append(f"config keys the run did not log, defaults used: {', '.join(missing)}")
    config.validate(cfg)
    return cfg, notes


def load_original(tracker, run_id: str) -> Original:
    import yaml

    run = fetch_run(tracker, run_id)
    experiment = tracker.client.get_experiment(run.info.experiment_id)
    local_dir, where = local_artifact_dir(tracker, run, experiment)
    target, moved = rerun_experiment(experiment)
    notes = [n for n in (where, moved) if n]

    text = read_artifact(tracker, run, local_dir, "config.yaml")
    if text is not None:
        try:
            cfg = config.from_dict(yaml.safe_load(text) or {})
        except ConfigError as e:
            raise ConfigError(f"config.yaml of run {run_id}: {e}") from None
        source = "config.yaml"
    else:
        cfg, params_notes = config_from_params(run.data.params)
        notes += [
            f"run {run_id} has no readable config.yaml; config rebuilt from its logged params",
            *params_notes,
        ]
        source = "params"

    env_text = read_artifact(tracker, run, local_dir, "environment.json")
    if env_text is None:
        notes.append("no environment.json for this run: the environment cannot be compared")
    if run.info.status != "FINISHED":
        notes.append(
            f"the run's status is {run.info.status} (pruned or stopped early); the "
            f"rerun trains all {cfg.train.epochs} epochs, so its numbers can differ"
        )

    return Original(
        run_id=run.info.run_id,
        experiment=experiment.name,
        rerun_experiment=target,
        status=run.info.status,
        config=cfg,
        source=source,
        metrics=dict(run.data.metrics),
        epoch_time_s=_median_epoch_time(tracker, run.info.run_id),
        environment=json.loads(env_text) if env_text else None,
        notes=notes,
    )


def _median_epoch_time(tracker, run_id: str) -> float | None:
    history = tracker.client.get_metric_history(run_id, TIME_METRIC)
    return statistics.median(m.value for m in history) if history else None


# --- the environment ------------------------------------------------------------------------


def environment_diff(logged: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per entry that differs, package versions one by one."""
    lines = []
    for key in sorted(set(logged) | set(current)):
        if key in ENV_IGNORED:
            continue
        old, new = logged.get(key), current.get(key)
        if isinstance(old, dict) or isinstance(new, dict):
            old, new = old or {}, new or {}
            lines += [
                f"environment differs: package {name}: {old.get(name)} in the run, "
                f"{new.get(name)} here"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]
        elif old != new:
            lines.append(f"environment differs: {key}: {old} in the run, {new} here")
    if logged.get("git_dirty"):
        lines.append(
            "the run's checkout had uncommitted changes (git_dirty): the code it ran "
            "is in no commit"
        )
    return lines


def check_environment(original: Original) -> list[str]:
    from accel.engine import resolve_device
    from accel.tracking import environment

    if original.environment is None:
        return []
    device = resolve_device(original.config.train.device)
    return environment_diff(
        original.environment, environment(str(device), original.config.train.seed)
    )


# --- rerunning and comparing ----------------------------------------------------------------


@dataclass
class Rerun:
    seed: int
    run_id: str | None
    metrics: dict[str, float]
    epoch_time_s: float


def point_at(cfg: Config, uri: str, experiment: str) -> None:
    """Log into the store we read from (not the one logged months ago) and `experiment`.

    Keys are changed only where they would resolve elsewhere, so that a rerun in the original
    store logs exactly the original params.
    """
    from accel.tracking import resolve_uri

    if resolve_uri(cfg.tracking.uri) != uri:
        cfg.tracking.uri = uri
    if (cfg.tracking.experiment or cfg.name) != experiment:
        cfg.tracking.experiment = experiment


def rerun(original: Original, tracker, seeds: list[int]) -> list[Rerun]:
    """Train the rebuilt config once per seed, each as a new run beside the original."""
    import copy

    from accel.train import train

    out = []
    for i, seed in enumerate(seeds):
        cfg = copy.deepcopy(original.config)
        cfg.train.seed = seed  # also reseeds the train/val split and the DataLoader order
        point_at(cfg, tracker.uri, original.rerun_experiment)
        note(f"rerun {i + 1}/{len(seeds)} of {original.run_id} with train.seed={seed}")
        result = train(
            cfg,
            run_name=f"reproduce-{original.run_id[:8]}-seed{seed}",
            tags={
                "accel.role": "reproduce",
                "accel.reproduces": original.run_id,
                "accel.config_source": original.source,
            },
        )
        times = [row[TIME_METRIC] for row in result.history]
        out.append(Rerun(seed, result.run_id, result.metrics, statistics.median(times)))
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _fmt_diff(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4f}"


def table(original: Original, reruns: list[Rerun], metric: str) -> str:
    """Original vs the logged-seed rerun, and mean / std / range over all seeds."""
    names = [m for m in TABLE_METRICS if m in original.metrics or m == metric]
    if metric not in names:
        names.insert(0, metric)
    first, k = reruns[0], len(reruns)
    head = ["metric", "original", f"rerun seed {first.seed}", "diff"]
    if k > 1:
        head += [f"mean ({k} seeds)", "std", "min", "max"]
    rows = [head]
    for name in [*names, TIME_METRIC]:
        if name == TIME_METRIC:
            orig, values = original.epoch_time_s, [r.epoch_time_s for r in reruns]
            label = f"{TIME_METRIC} (median)"
        else:
            orig, values = original.metrics.get(name), [r.metrics.get(name) for r in reruns]
            label = name + (" *" if name == metric else "")
        if any(v is None for v in values):
            continue
        diff = values[0] - orig if orig is not None else None
        row = [label, _fmt(orig), _fmt(values[0]), _fmt_diff(diff)]
        if k > 1:  # spread over seeds: sample std and range
            row += [
                _fmt(statistics.fmean(values)),
                _fmt(statistics.stdev(values)),
                _fmt(min(values)),
                _fmt(max(values)),
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    seeds = ", ".join(str(r.seed) for r in reruns)
    title = (
        f"run {original.run_id} ({original.experiment}, config from {original.source}) "
        f"vs rerun(s) with seed(s) {seeds}"
    )
    footer = (
        "* the search metric; other seeds also change the train/val split; "
        "epoch time depends on the machine and its load"
    )
    return "\n".join([title, *lines, footer])


def verdict(
    original: Original, reruns: list[Rerun], metric: str, tolerance: float
) -> tuple[bool, str]:
    orig, new = original.metrics[metric], reruns[0].metrics[metric]
    diff = abs(new - orig)
    ok = diff <= tolerance
    how = "exactly" if diff == 0 else f"|diff| {diff:.3g} <= {tolerance:g}"
    if ok:
        return True, f"reproduced: {metric} {new:.4f} vs {orig:.4f} ({how})"
    return False, (
        f"NOT reproduced: {metric} {new:.4f} vs {orig:.4f} "
        f"(|diff| {diff:.3g} > tolerance {tolerance:g})"
    )


def reproduce(
    run_id: str, *, seeds: int = 1, tolerance: float = 0.005, tracking_uri: str | None = None
) -> tuple[int, Original, list[Rerun]]:
    """The whole command without argparse: returns (exit code, original, reruns)."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be >= 1")
    if not tolerance >= 0:
        raise ConfigError(f"--tolerance {tolerance}: must be >= 0")
    tracker = open_store(tracking_uri)
    original = load_original(tracker, run_id)
    metric = original.config.search.metric
    if metric not in original.metrics:
        raise ConfigError(
            f"run {run_id} logged no {metric} (search.metric): nothing to compare "
            f"against; it logged: {', '.join(sorted(original.metrics)) or 'nothing'}"
        )
    for line in original.notes:
        note(line)
    for line in check_environment(original):
        warn(line)

    base = original.config.train.seed
    reruns = rerun(original, tracker, [base + i for i in range(seeds)])
    print(table(original, reruns, metric))
    print("reruns: " + ", ".join(str(r.run_id) for r in reruns))
    ok, line = verdict(original, reruns, metric, tolerance)
    print(line)
    return (0 if ok else EXIT_NOT_REPRODUCED), original, reruns


def cli_reproduce(args) -> int:
    code, _, _ = reproduce(
        args.run_id, seeds=args.seeds, tolerance=args.tolerance, tracking_uri=args.tracking_uri
    )
    return code
