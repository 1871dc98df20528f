"""`accel verify`: a study's top trials and its baseline rerun over the same fresh seeds.

The study: trials 0 and 1 have identical values (queued twice), trial 2 runs the file's own
learning rate, 1e-6, far too small to learn in two epochs of 15 updates (lr 0.01 reaches 0.93 or
more there, 1e-6 stays at chance: the paired difference's interval clears 0.5 by far)."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, cli_main, new_store

STUDY_YAML = """\
name: vstudy
data: {dataset: digits, val_fraction: 0.2}
model: {name: accel_cnn_s, img_size: 8}
train: {epochs: 2, epoch_length: 15, batch_size: 32, lr: 1.0e-6, device: cpu, amp: "off"}
tracking: {system_metrics: false}
search:
  metric: val_accuracy
  direction: maximize
  pruner: none
  space:
    train.lr: {type: float, low: 1.0e-6, high: 1.0e-1, log: true}
  enqueue:
    - {train.lr: 0.01}
    - {train.lr: 0.01}
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study, tuned once, and its first verification's output."""
    folder = tmp_path_factory.mktemp("verify")
    (folder / "study.yaml").write_text(STUDY_YAML)
    flags = ["--storage", str(folder / "optuna.journal"), "--tracking-uri", new_store(folder)]
    code, _, err = cli_main("tune", str(folder / "study.yaml"), "--n-trials", "3", *flags)
    assert code == 0, err
    code, out, err = cli_main("verify", "--study", "vstudy", "--top", "2", "--seeds", "3", *flags)
    assert code == 0, err
    return folder, flags, out


def client(flags):
    from mlflow.tracking import MlflowClient

    return MlflowClient(flags[flags.index("--tracking-uri") + 1])


def reruns(flags):
    c = client(flags)
    exp = c.get_experiment_by_name("vstudy")
    return c.search_runs([exp.experiment_id], "tags.`accel.role` = 'verify-rerun'")


def verify_run(flags):
    c = client(flags)
    exp = c.get_experiment_by_name("vstudy")
    (run,) = c.search_runs([exp.experiment_id], "tags.`accel.role` = 'verify'")
    return run


def test_identical_trials_are_not_distinguishable_and_a_tiny_lr_is_beaten(study):
    _, flags, out = study
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("trials 0, 1 are not distinguishable"), out
    assert "beats the file's values by +" in verdict, out
    run = verify_run(flags)
    assert run.info.status == "FINISHED"
    assert run.data.tags["accel.verdict"] == verdict
    parent = client(flags).get_run(run.data.tags["accel.study_run"])
    assert parent.data.tags["accel.verified_best"] in ("0", "1")
    assert float(parent.data.tags["accel.p_best"]) == pytest.approx(0.5, abs=0.05)


def test_seeds_are_fresh_and_paired_across_trials(study):
    _, flags, _ = study
    runs = reruns(flags)
    assert len(runs) == 3 * 3 and all(r.info.status == "FINISHED" for r in runs)
    seeds = {}
    for r in runs:
        seeds.setdefault(r.data.tags["accel.verify.trial"], set()).add(r.data.tags[
            "accel.verify.seed"])
        assert r.data.params["train.seed"] == r.data.tags["accel.verify.seed"]
    assert set(seeds) == {"0", "1", "2"}
    assert seeds["0"] == seeds["1"] == seeds["2"] and len(seeds["0"]) == 3
    assert "0" not in seeds["0"]  # the trials' own seed (train.seed=0) is not reused


def t_interval(values) -> tuple[float, float]:
    """The 95% Student-t interval of the mean, from scipy directly."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    return stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))


def test_the_intervals_are_student_t_of_the_logged_values_and_few_seeds_are_said(study):

    folder, flags, out = study
    run = verify_run(flags)
    path = client(flags).download_artifacts(run.info.run_id, "verify.csv", str(folder))
    rows = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    by_trial: dict[str, list[float]] = {}
    for row in sorted(rows, key=lambda r: int(r["seed"])):
        by_trial.setdefault(row["trial"], []).append(float(row["val_accuracy"]))
    # each logged value is the rerun run's own best_val_accuracy
    logged = {(r.data.tags["accel.verify.trial"], r.data.tags["accel.verify.seed"]):
              r.data.metrics["best_val_accuracy"] for r in reruns(flags)}
    assert sorted(float(r["val_accuracy"]) for r in rows) == sorted(logged.values())
    assert all(r.data.metrics["verify_val_accuracy"] == r.data.metrics["best_val_accuracy"]
               for r in reruns(flags))
    data = tuple(np.array(by_trial[t]) for t in ("0", "1", "2"))
    for i, trial in enumerate(("0", "1", "2")):
        line = next(x for x in out.splitlines() if x.split()[:1] == [trial])
        low, high = t_interval(data[i])
        assert f"[{low:.4f}, {high:.4f}]" in line, (line, low, high)
    low, high = t_interval(data[0] - data[2])  # paired by seed
    assert f"[{100 * low:.1f}, {100 * high:.1f}]" in out.splitlines()[-1]
    assert low > 0.5  # a learning rate of 1e-6 learns nothing in 2 short epochs
    assert "3 seeds: each 95% t-interval is wide" in out.splitlines()[0]


def test_the_same_command_again_trains_nothing_and_says_the_same(study):
    _, flags, out = study
    before = len(reruns(flags))
    code, again, err = cli_main("verify", "--study", "vstudy", "--top", "2", "--seeds", "3",
                                *flags)
    assert code == 0, err
    assert again == out
    assert len(reruns(flags)) == before
    assert "9 rerun(s) done before, 0 to run" in err


def test_best_shows_the_verification_and_registers_the_verified_best(study):
    _, flags, out = study
    code, shown, err = cli_main("best", "--study", "vstudy", *flags)
    assert code == 0, err
    assert out.strip().splitlines()[-1] in shown  # the verdict
    assert "verified over seeds 1,2,3" in shown
    code, shown, err = cli_main("best", "--study", "vstudy", "--register", "vmodel",
                                "--verified", *flags)
    assert code == 0, err
    version = client(flags).get_model_version_by_alias("vmodel", "champion")
    assert version.tags["accel.verify_run"] == verify_run(flags).info.run_id
    assert version.tags["optuna.trial_number"] == verify_run(flags).data.tags[
        "accel.verified_best"]


def test_verified_without_a_verification_exits_2(tmp_path):
    (tmp_path / "study.yaml").write_text(STUDY_YAML.replace("name: vstudy", "name: fresh"))
    flags = ["--storage", str(tmp_path / "optuna.journal"), "--tracking-uri", new_store(tmp_path)]
    assert cli_main("tune", str(tmp_path / "study.yaml"), "--n-trials", "0", *flags)[0] == 0
    code, _, err = cli_main("best", "--study", "fresh", "--verified", *flags)
    assert code == 2 and "run `accel verify --study fresh` first" in err


@pytest.mark.parametrize("flag, value, says", [("--seeds", "1", "--seeds 1: must be >= 2"),
                                               ("--top", "0", "--top 0: must be >= 1")])
def test_too_few_seeds_or_trials_exit_2_with_one_line(study, flag, value, says):
    _, flags, _ = study
    code, out, err = cli_main("verify", "--study", "vstudy", flag, value, *flags)
    assert code == 2 and out == ""
    assert err.strip().startswith(f"accel: error: {says}") and len(err.strip().splitlines()) == 1


def test_sigterm_during_verify_leaves_nothing_running(study):
    folder, flags, _ = study
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "accel", "verify", "--study", "vstudy",
                             "--top", "2", "--seeds", "5", *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(r.info.status == "RUNNING"
                                                  for r in reruns(flags)):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    statuses = [r.info.status for r in reruns(flags)]
    assert "RUNNING" not in statuses and "KILLED" in statuses
    assert verify_run(flags).info.status == "KILLED"


TWO_OBJECTIVES = STUDY_YAML.replace("name: vstudy", "name: vfront").replace(
    "  metric: val_accuracy\n  direction: maximize\n",
    "  objectives:\n    - {metric: val_accuracy, direction: maximize}\n"
    "    - {metric: val_loss, direction: minimize}\n").replace(
    "    - {train.lr: 0.01}\n    - {train.lr: 0.01}\n",
    "    - {train.lr: 0.01}\n    - {train.lr: 0.002}\n")


# make test covers it: verify's intervals: this file's single-objective tests
@pytest.mark.slow
def test_a_front_gets_an_interval_per_objective_and_its_chance_to_stay_non_dominated(tmp_path):
    from scipy.stats import bootstrap

    from accel.verify.stats import non_dominated

    (tmp_path / "front.yaml").write_text(TWO_OBJECTIVES)
    flags = ["--storage", str(tmp_path / "optuna.journal"), "--tracking-uri", new_store(tmp_path)]
    code, _, err = cli_main("tune", str(tmp_path / "front.yaml"), "--n-trials", "3", *flags)
    assert code == 0, err
    code, out, err = cli_main("verify", "--study", "vfront", "--seeds", "3", *flags)
    assert code == 0, err
    c = client(flags)
    (run,) = c.search_runs([c.get_experiment_by_name("vfront").experiment_id],
                           "tags.`accel.role` = 'verify'")
    path = c.download_artifacts(run.info.run_id, "verify.csv", str(tmp_path))
    rows = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    trials = sorted({r["trial"] for r in rows}, key=int)
    assert "2" in trials  # the baseline, lr 1e-6, is rerun beside the front
    values = np.array([[[float(r[m]) for r in sorted(rows, key=lambda r: int(r["seed"]))
                         if r["trial"] == t] for m in ("val_accuracy", "val_loss")]
                       for t in trials])
    direct = bootstrap(tuple(values.reshape(len(trials) * 2, -1)),
                       lambda *xs, axis=-1: np.stack([x.mean(axis=axis) for x in xs]),
                       paired=True, vectorized=True, n_resamples=9999, method="percentile",
                       rng=np.random.default_rng(0)).bootstrap_distribution
    means = direct.reshape(len(trials), 2, -1)
    p = np.mean([non_dominated(means[:, :, b], [True, False]) for b in range(means.shape[2])],
                axis=0)
    lines = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    for t, expected in zip(trials, p, strict=True):
        assert lines[t].endswith(f"{expected:.2f}"), (lines[t], expected)
    assert p[trials.index("2")] == 0.0  # learns nothing: dominated in every resample
    assert out.splitlines()[-1].startswith("stay on the front over seeds (p >= 0.5): trials")
