"""What a report reads of MLflow's record of a run: its page in the UI, the data it saw, the
machine it ran on, a metric's curve, and where its time went."""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path

from accel.report.page import cell
from accel.tracking import retry_locked
from accel.tracking.store import UI_URL
from accel.uris import DEFAULT_URI, redact

# The time split a run may log per epoch: time_<part>_s (or split_<part>_s), e.g. time_data_s.
SPLIT = re.compile(r"^(?:time|split)[_/](?!to_target)(\w+?)_s$")
MFU = re.compile(r"(^|[_/])mfu$")
FLOPS = re.compile(r"flop", re.IGNORECASE)
PER_EPOCH = ("val_accuracy", "val_f1", "val_loss", "train_loss")  # curves a run can draw


def store_flag(uri: str) -> str:
    """` --tracking-uri URI` where the store is not the default one (its password hidden)."""
    return f" --tracking-uri {shlex.quote(redact(uri))}" if uri != DEFAULT_URI else ""


def run_page(uri: str, experiment_id: str, run_id: str) -> tuple[str, str]:
    """(the run's page in the MLflow UI, what serves it): a tracking server's own page, or the
    page `accel ui` serves for a local store."""
    from urllib.parse import urlparse

    if uri.startswith(("http://", "https://")):
        parts = urlparse(uri)
        base = parts._replace(netloc=parts.netloc.rpartition("@")[2], path="").geturl()
        served = "the tracking server"
    else:
        base, served = UI_URL, f"accel ui{store_flag(uri)}"
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}", served


def artifact_text(tracker, run_id: str, name: str) -> str | None:
    """An artifact's text, or None where the run has no such artifact (or it cannot be read)."""
    with tempfile.TemporaryDirectory(prefix="accel-report-") as tmp:
        try:
            path = retry_locked(tracker.client.download_artifacts, run_id, name, tmp)
            return Path(path).read_text()
        except Exception:  # missing, or the artifact store is away: the page says so
            return None


def data_facts(run) -> list[tuple[str, str]]:
    """One fact per dataset the run logged: its name, context, size, source and digest."""
    out = []
    for d in getattr(run.inputs, "dataset_inputs", None) or []:
        tags = {t.key: t.value for t in d.tags}
        try:
            source = json.loads(d.dataset.source).get("uri", d.dataset.source)
        except (ValueError, AttributeError):
            source = d.dataset.source
        try:
            rows = json.loads(d.dataset.profile or "{}").get("samples")
        except ValueError:
            rows = None
        size = f", {rows} samples" if rows else ""
        out.append((f"data: {d.dataset.name}",
                    f"{tags.get('mlflow.data.context', 'input')}{size}, digest "
                    f"{d.dataset.digest}, from {source}"))
    return out


def machine_facts(env: dict | None) -> list[tuple[str, str]]:
    """The machine a run ran on, from its environment.json."""
    if not env:
        return [("machine", "not recorded (the run has no environment.json)")]
    gpu = env.get("gpu") or "no GPU"
    if env.get("gpu_count", 0) > 1:
        gpu += f" x {env['gpu_count']}"
    packages = env.get("packages") or {}
    commit = env.get("git_commit") or "unknown"
    return [("machine", f"{env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores; {gpu}"),
            ("software", f"python {env.get('python', '?')}, torch {env.get('torch', '?')}"
                         f" (CUDA {env.get('cuda') or 'none'}), accel {packages.get('accel', '?')}"
                         f", optuna {packages.get('optuna', '?')}, mlflow "
                         f"{packages.get('mlflow', '?')}; {env.get('platform', '?')}"),
            ("threads", f"{env.get('torch_threads', '?')} torch threads on "
                        f"{env.get('device', '?')}"),
            ("code", f"git commit {commit}"
                     + (" with uncommitted changes" if env.get("git_dirty") else ""))]


def environment(tracker, run_id: str) -> dict | None:
    text = artifact_text(tracker, run_id, "environment.json")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def curve_metric(names: list[str]) -> str:
    """The per-epoch metric to draw for objectives `names`: the first one logged per epoch."""
    return next((n for n in names if n in PER_EPOCH), "val_loss")


def history(tracker, run, metric: str) -> list[tuple[float, int, float]]:
    """(seconds since the run began, epoch, value) of `metric`, epoch by epoch."""
    points = retry_locked(tracker.client.get_metric_history, run.info.run_id, metric)
    start = run.info.start_time or 0
    return sorted(((m.timestamp - start) / 1000.0, int(m.step), m.value) for m in points)


def wall_s(run) -> float | None:
    if not run.info.end_time or not run.info.start_time:
        return None
    return (run.info.end_time - run.info.start_time) / 1000.0


def time_parts(run) -> dict[str, float]:
    """Where the run's time went: the split where it logged one (its last epoch), else its
    training epochs and the rest of its wall time (set-up, evaluation, logging)."""
    metrics = run.data.metrics
    split = {m.group(1): v for k, v in metrics.items() if (m := SPLIT.match(k))}
    if split:
        return split
    wall, training = wall_s(run), metrics.get("train_time_s")
    if wall is None or training is None:
        return {}
    return {"training epochs": training, "the rest": max(wall - training, 0.0)}


def speed_facts(run) -> list[str]:
    """MFU, achieved FLOP/s and throughput where the run logged them."""
    metrics = run.data.metrics
    said = [f"MFU {cell(v, 3)}" for k, v in sorted(metrics.items()) if MFU.search(k)]
    said += [f"{k} {cell(v, 3)}" for k, v in sorted(metrics.items()) if FLOPS.search(k)]
    if "train_throughput" in metrics:
        said.append(f"{metrics['train_throughput']:.0f} images/s")
    return said


def split_logged(runs) -> bool:
    return any(SPLIT.match(k) or MFU.search(k) for r in runs for k in r.data.metrics)
