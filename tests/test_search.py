"""`accel tune` / `accel best`: the search space, the study's layout in Optuna and MLflow, resume,
conflicts, worker processes, failures, Ctrl-C and the PostgreSQL storage. Tiny model, few
iterations, CPU; every study lives in tmp_path."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from accel import config
from accel import tune as search
from accel.cli import main
from accel.tune import storage as tune_storage
from accel.tune import workers as tune_workers
from tests.conftest import ROOT, run_cli, run_in_process

# Like conftest's `tiny_overrides`, with fewer iterations: a trial takes a few seconds.
TINY = {
    "data": {"dataset": "digits", "num_workers": 0, "val_fraction": 0.05},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 2, "epoch_length": 3, "batch_size": 16, "device": "cpu", "amp": "off",
              "lr": 3.0e-3},
    "tracking": {"log_checkpoint": False, "figures": False},
}
# The five mission parameters; small ranges so that no sampled trial diverges by chance.
SPACE = {
    "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True},
    "train.optimizer": {"type": "categorical", "choices": ["adam", "adamw", "sgd"]},
    "train.weight_decay": {"type": "float", "low": 0.0, "high": 0.1},
    "train.clip_grad_norm": {"type": "categorical", "choices": [None, 1.0]},
    "train.accumulation_steps": {"type": "int", "low": 1, "high": 2},
}
NAN_LR = 1.0e12  # makes the loss NaN within a few updates


@dataclass
class Stores:
    """One study's Optuna journal and MLflow store, both under one tmp folder."""

    root: Path

    @property
    def storage(self) -> str:
        return str(self.root / "optuna.journal")

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlruns' / 'mlflow.db'}"

    def study(self, name: str):
        import optuna

        return optuna.load_study(study_name=name, storage=search.open_storage(self.storage))

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def runs(self, name: str) -> list:
        client = self.client()
        exp = client.get_experiment_by_name(name)
        assert exp is not None, f"no MLflow experiment named {name}"
        return client.search_runs([exp.experiment_id], max_results=1000)

    def tune(self, experiment_file: Path, name: str, *args: str, overrides=()) -> int:
        """`accel tune FILE [KEY=VALUE ...] --study NAME ...`, in this process."""
        return main(["tune", str(experiment_file), *overrides, "--study", name,
                     "--storage", self.storage, "--tracking-uri", self.uri, *args])


def experiment(folder: Path, name: str, space: dict | None = None, **search_keys) -> Path:
    data = copy.deepcopy(TINY)
    data["name"] = name
    space = copy.deepcopy(SPACE if space is None else space)
    data["search"] = {"n_trials": 2, "space": space, **search_keys}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def role(runs, name: str) -> list:
    return [r for r in runs if r.data.tags.get("accel.role") == name]


# --- the search space --------------------------------------------------------------------------


def test_quickstart_space_has_the_five_mission_parameters():
    cfg = config.load(ROOT / "experiments" / "quickstart.yaml")
    dims = {d.key: d for d in search.check_search(cfg)}
    assert set(dims) == {"train.lr", "train.optimizer", "train.weight_decay",
                         "train.clip_grad_norm", "train.accumulation_steps"}
    assert dims["train.lr"].type == "float" and dims["train.lr"].log
    assert set(dims["train.optimizer"].choices) == {"adam", "adamw", "sgd"}
    assert None in dims["train.clip_grad_norm"].choices  # clipping off is a choice
    assert dims["train.accumulation_steps"].type == "int"


def test_trial_values_reach_the_config():
    import optuna

    cfg = config.from_dict({**TINY, "search": {"space": SPACE}})
    dims = search.check_search(cfg)
    fixed = optuna.trial.FixedTrial({"train.lr": 0.005, "train.optimizer": "sgd",
                                     "train.weight_decay": 0.01, "train.clip_grad_norm": None,
                                     "train.accumulation_steps": 2})
    out = search.trial_config(cfg, dims, fixed)
    assert (out.train.lr, out.train.optimizer, out.train.weight_decay) == (0.005, "sgd", 0.01)
    assert out.train.clip_grad_norm is None and out.train.accumulation_steps == 2
    assert cfg.train.optimizer == "adamw", "the base config must not change"
    # The stored definition survives a JSON round trip unchanged (what resume compares).
    definition = search.definition(cfg, dims)
    assert json.loads(json.dumps(definition)) == definition


CONDITIONAL = {
    "train.optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
    # listed before the key it depends on: the space is ordered so that conditions come first
    "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True},
}
MOMENTUM = {"train.momentum": {"type": "float", "low": 0.8, "high": 0.95,
                               "when": {"train.optimizer": "sgd"}}}


def test_a_when_parameter_is_suggested_only_where_its_condition_holds():
    import optuna

    cfg = config.from_dict({**TINY, "search": {"space": {**MOMENTUM, **CONDITIONAL}}})
    dims = search.check_search(cfg)
    assert [d.key for d in dims][-1] == "train.momentum"
    base = cfg.train.momentum
    adam = search.trial_config(cfg, dims, optuna.trial.FixedTrial(
        {"train.optimizer": "adam", "train.lr": 0.002, "train.momentum": 0.8}))
    assert adam.train.optimizer == "adam" and adam.train.momentum == base  # not suggested
    sgd = search.trial_config(cfg, dims, optuna.trial.FixedTrial(
        {"train.optimizer": "sgd", "train.lr": 0.002, "train.momentum": 0.8}))
    assert (sgd.train.optimizer, sgd.train.momentum) == ("sgd", 0.8)
    assert search.definition(cfg, dims)["space"]["train.momentum"]["when"] == {
        "train.optimizer": ["sgd"]}


def test_a_when_parameter_is_absent_from_trials_where_its_condition_fails(tmp_path):
    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "cond", space={**MOMENTUM, **CONDITIONAL}, sampler="random")
    assert stores.tune(exp, "cond", "--n-trials", "6") == 0
    trials = stores.study("cond").trials
    by_optimizer = {t.params["train.optimizer"] for t in trials}
    assert by_optimizer == {"adam", "sgd"}  # both sides of the condition ran
    for t in trials:
        assert ("train.momentum" in t.params) == (t.params["train.optimizer"] == "sgd"), t.params
    runs = {r.data.tags.get("optuna.trial_number"): r for r in stores.runs("cond")}
    for t in trials:
        if "train.momentum" in t.params:  # the suggested value is what the run trained with
            logged = float(runs[str(t.number)].data.params["train.momentum"])
            assert logged == pytest.approx(t.params["train.momentum"])


TWO_OBJECTIVES = [{"metric": "val_accuracy", "direction": "maximize"},
                  {"metric": "train_time_s", "direction": "minimize"}]


def non_dominated(points: dict[int, tuple[float, float]]) -> set[int]:
    """Trials no other trial beats on accuracy (higher) and time (lower) at once."""
    def beats(a, b):
        return a[0] >= b[0] and a[1] <= b[1] and a != b
    return {n for n, p in points.items() if not any(beats(q, p) for q in points.values())}


def test_a_two_objective_study_keeps_its_pareto_front(tmp_path, capsys):
    import csv
    import io

    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "mo", objectives=TWO_OBJECTIVES, pruner="none", sampler="nsga2")
    assert stores.tune(exp, "mo", "--n-trials", "6") == 0
    complete = [t for t in stores.study("mo").trials if t.state.name == "COMPLETE"]
    assert len(complete) == 6
    runs = {int(r.data.tags["optuna.trial_number"]): r for r in role(stores.runs("mo"), "trial")}
    # Each trial's values are its run's own metrics: the best epoch's accuracy, the run's time.
    own = {n: (r.data.metrics["best_val_accuracy"], r.data.metrics["train_time_s"])
           for n, r in runs.items()}
    for t in complete:
        assert t.values == pytest.approx(list(own[t.number]), rel=1e-9)
    expected = non_dominated(own)

    [parent] = role(stores.runs("mo"), "study")
    client = stores.client()
    rows = list(csv.DictReader(io.StringIO(
        Path(client.download_artifacts(parent.info.run_id, "pareto.csv", str(tmp_path)))
        .read_text())))
    assert {int(r["number"]) for r in rows} == expected
    assert {r["run_id"] for r in rows} == {runs[n].info.run_id for n in expected}
    parent = client.get_run(parent.info.run_id)
    assert parent.data.metrics["n_pareto"] == len(expected)
    assert parent.data.metrics["best_train_time_s"] == min(own[n][1] for n in expected)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/pareto_front.html", "plots/pareto_front.png"} <= artifacts
    for n, run in runs.items():
        assert run.data.tags["accel.pareto"] == str(n in expected).lower()

    capsys.readouterr()
    assert main(["best", "--study", "mo", "--storage", stores.storage,
                 "--tracking-uri", stores.uri]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("  trial ")]
    assert {int(line.split()[1].rstrip(":")) for line in listed} == expected
    assert all("accel reproduce " in line for line in listed)
    assert main(["best", "--study", "mo", "--storage", stores.storage,
                 "--tracking-uri", stores.uri, "--pick", "train_time_s"]) == 0
    fastest = min(expected, key=lambda n: own[n][1])
    assert f"best trial: {fastest}\n" in capsys.readouterr().out
    assert main(["best", "--study", "mo", "--storage", stores.storage,
                 "--tracking-uri", stores.uri, "--pick", "val_loss"]) == 2
    assert "not an objective" in capsys.readouterr().err
    # The objectives define the study: a rerun with others is refused before any trial.
    other = experiment(tmp_path, "mo2", pruner="none", objectives=[
        TWO_OBJECTIVES[0], {"metric": "peak_memory_mb", "direction": "minimize"}])
    assert stores.tune(other, "mo", "--n-trials", "1") == 2
    assert "exists with another definition" in capsys.readouterr().err
    assert len(stores.study("mo").trials) == 6


@pytest.mark.parametrize("objectives,words", [
    ([{"metric": "val_accuracy", "direction": "maximize"}], "list two or more"),
    ([{"metric": "val_acc", "direction": "maximize"}, TWO_OBJECTIVES[1]],
     "search.objectives[0].metric='val_acc' is not one of: val_accuracy"),
    ([TWO_OBJECTIVES[0], {"metric": "train_time_s", "direction": "down"}],
     "search.objectives[1].direction='down' is not one of: maximize, minimize"),
    ([TWO_OBJECTIVES[0], TWO_OBJECTIVES[0]], "a metric is listed twice"),
    ([TWO_OBJECTIVES[0], "train_time_s"], "expected {metric: ..., direction: ...}"),
])
def test_bad_objectives_are_refused_with_one_line(objectives, words):
    with pytest.raises(config.ConfigError) as e:
        config.from_dict({**TINY, "search": {"objectives": objectives, "pruner": "none",
                                             "space": SPACE}})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_pruning_with_two_objectives_is_refused(tmp_path):
    exp = experiment(tmp_path, "mo", objectives=TWO_OBJECTIVES)  # the default pruner: median
    proc = run_in_process("tune", str(exp), "--storage", str(tmp_path / "optuna.journal"),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line == ("accel: error: search.pruner=median: Optuna prunes single-objective studies "
                    "only; with 2 objectives set search.pruner=none")


# --- warm starts -------------------------------------------------------------------------------

RUN_VALUES = {"train.lr": 0.0042, "train.optimizer": "sgd", "train.weight_decay": 0.03,
              "train.clip_grad_norm": 1.0, "train.accumulation_steps": 2}


def logged_run(stores: Stores, values: dict, experiment_name: str = "elsewhere") -> str:
    """An `accel train` run in the study's store (another experiment), trained with `values`."""
    exp = experiment(stores.root, "one")
    assert main(["train", str(exp), *(f"{k}={v}" for k, v in values.items()),
                 "--tracking-uri", stores.uri, "--experiment", experiment_name]) == 0
    client = stores.client()
    [run] = client.search_runs([client.get_experiment_by_name(experiment_name).experiment_id])
    return run.info.run_id


def test_enqueued_runs_and_file_entries_come_first_then_the_baseline(tmp_path):
    stores = Stores(tmp_path)
    run_id = logged_run(stores, RUN_VALUES)
    exp = experiment(tmp_path, "warm", enqueue=[{"train.lr": 0.005, "train.optimizer": "adam"}])
    assert stores.tune(exp, "warm", "--n-trials", "3", "--enqueue", run_id) == 0
    trials = stores.study("warm").trials
    assert trials[0].params == RUN_VALUES  # the run's values, typed as the space has them
    assert trials[0].user_attrs["accel.enqueued_from"] == run_id
    assert (trials[1].params["train.lr"], trials[1].params["train.optimizer"]) == (0.005, "adam")
    assert trials[1].user_attrs["accel.enqueued_from"] == "search.enqueue[0]"
    assert trials[2].user_attrs.get("accel.baseline") is True
    [parent] = role(stores.runs("warm"), "study")
    assert run_id in parent.data.tags["accel.warm_start"]


def flipped_copy(stores: Stores, name: str, to: str) -> None:
    """Study `to`: the COMPLETE trials of `name`, same params, each val_accuracy v as 1 - v
    (the best trial becomes the worst)."""
    import optuna

    storage = search.open_storage(stores.storage)
    source = stores.study(name)
    flipped = optuna.create_study(study_name=to, storage=storage, direction="maximize")
    flipped.set_metric_names(source.metric_names)
    flipped.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                  value=1.0 - t.value)
                        for t in source.trials if t.state.name == "COMPLETE"])


def test_from_study_copies_finished_trials_and_the_sampler_learns_from_them(tmp_path,
                                                                            monkeypatch):
    """The copies count as TPE's startup trials, and its first suggestion depends on their
    values: the same seed over the same params with the values flipped suggests elsewhere
    (a sampler that ignored the copies would sample both at random, alike)."""
    import optuna

    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "warm", pruner="none")
    assert stores.tune(exp, "old", "--n-trials", "3") == 0
    old = [t for t in stores.study("old").trials if t.state.name == "COMPLETE"]
    flipped_copy(stores, "old", "flipped")
    monkeypatch.setattr(tune_workers, "build_sampler", lambda name, seed: optuna.samplers
                        .TPESampler(seed=0, n_startup_trials=len(old)))
    suggested = {}
    for source, name in (("old", "new"), ("flipped", "new2")):
        # The baseline (the file's values), then one trial TPE suggests.
        assert stores.tune(exp, name, "--n-trials", "2", "--from-study", source) == 0
        new = stores.study(name).trials
        copied = [t for t in new if "accel.copied_from" in t.user_attrs]
        assert [t.params for t in copied] == [t.params for t in old]
        assert {t.user_attrs["accel.copied_from"] for t in copied} == {f"{source}#{t.number}"
                                                                       for t in old}
        [sampled] = [t for t in new if t not in copied and "accel.baseline" not in t.user_attrs]
        suggested[source] = sampled.params
    assert [t.values for t in stores.study("new").trials
            if "accel.copied_from" in t.user_attrs] == [t.values for t in old]
    assert suggested["old"] != suggested["flipped"], suggested
    # The same command again copies nothing twice.
    assert stores.tune(exp, "new", "--n-trials", "0", "--from-study", "old") == 0
    assert len([t for t in stores.study("new").trials
                if "accel.copied_from" in t.user_attrs]) == len(old)


def test_bad_warm_starts_exit_2_with_one_line(tmp_path):
    stores = Stores(tmp_path)
    outside = logged_run(stores, {**RUN_VALUES, "train.lr": 0.5})
    exp = experiment(tmp_path, "warm")
    mo = experiment(tmp_path, "mo", objectives=TWO_OBJECTIVES, pruner="none")
    assert stores.tune(exp, "first", "--n-trials", "0") == 0
    cases = [
        (["--enqueue", "0" * 32], "--enqueue 00000000000000000000000000000000: no such run"),
        (["--enqueue", outside], f"--enqueue {outside}: train.lr=0.5 is outside the search"),
        (["--from-study", "nope"], "--from-study nope: no such study"),
        (["--from-storage", stores.storage], "--from-storage needs --from-study"),
    ]
    where = ["--storage", stores.storage, "--tracking-uri", stores.uri]
    for extra, words in cases:
        proc = run_in_process("tune", str(exp), "--study", "w2", *where, *extra)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert words in line, line
    proc = run_in_process("tune", str(mo), "--study", "w3", *where, "--from-study", "first")
    assert proc.returncode == 2 and "its objectives" in proc.stderr.strip().splitlines()[-1]
    bad_file = experiment(tmp_path, "bad", enqueue=[{"train.lrr": 0.01}])
    proc = run_in_process("tune", str(bad_file), *where)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "search.enqueue[0]: train.lrr is not a key of the search space" in line


@pytest.mark.parametrize("name", search.PRUNERS)
def test_each_pruner_can_be_chosen_from_the_command_line(name):
    import optuna

    kinds = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
             "hyperband": optuna.pruners.HyperbandPruner}
    cfg = config.load(ROOT / "experiments" / "quickstart.yaml", [f"search.pruner={name}"])
    search.check_search(cfg)
    assert isinstance(search.build_pruner(cfg.search.pruner, cfg.train.epochs), kinds[name])


@pytest.mark.parametrize("outcome", ["pruned", "failed"])
def test_the_exit_code_says_whether_an_invocation_failed_and_why(tmp_path, monkeypatch,
                                                                  outcome, capfd):
    """Pruned trials are the pruner's verdict: exit 0. Failed ones with none complete: exit 1,
    and the last line says why."""
    import optuna

    class AlwaysPrune(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            return True

    monkeypatch.setattr(tune_workers, "build_pruner", lambda *a: AlwaysPrune())
    stores = Stores(tmp_path)
    space = {"train.weight_decay": SPACE["train.weight_decay"]}  # train.lr stays as set
    path = experiment(tmp_path, "exits", space)
    overrides = [f"train.lr={NAN_LR}", "train.optimizer=sgd"] if outcome == "failed" else []
    code = stores.tune(path, "exits", "--n-trials", "1", overrides=overrides)
    err = capfd.readouterr().err
    [trial] = stores.study("exits").trials
    assert trial.state.name == {"pruned": "PRUNED", "failed": "FAIL"}[outcome]
    if outcome == "pruned":
        assert code == 0, err[-2000:]
        assert "1 pruned, 0 failed" in err
    else:
        assert code == 1, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            "accel: exit 1: no trial of this invocation completed and some failed; each failed "
            "trial's run holds its error (tag accel.error)")


INVALID = {
    "unknown key": ({"train.lrr": {"type": "float", "low": 0.1, "high": 1.0}},
                    "unknown config key"),
    "low >= high": ({"train.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "must be < high"),
    "log, low <= 0": ({"train.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}},
                      "log: true needs low > 0"),
    "empty choices": ({"train.optimizer": {"type": "categorical", "choices": []}},
                      "non-empty list"),
    "choice the config rejects": ({"train.optimizer": {"type": "categorical",
                                                       "choices": ["adam", "lion"]}}, "lion"),
    "bound the config rejects": ({"train.accumulation_steps": {"type": "int", "low": 0,
                                                               "high": 4}}, ">= 1"),
    "unknown type": ({"train.lr": {"type": "loguniform", "low": 0.1, "high": 1.0}},
                     "not one of: float, int, categorical"),
    "empty space": ({}, "search.space is empty"),
    "when on a key outside the space": (
        {"train.lr": {"type": "float", "low": 0.001, "high": 0.01,
                      "when": {"train.optimizer": "sgd"}}}, "not another key of the space"),
    "when on an unknown key": (
        {**SPACE, "train.momentum": {"type": "float", "low": 0.8, "high": 0.99,
                                     "when": {"train.optimiser": "sgd"}}},
        "train.optimiser is not another key"),
    "when on a value never suggested": (
        {**SPACE, "train.momentum": {"type": "float", "low": 0.8, "high": 0.99,
                                     "when": {"train.optimizer": "lion"}}},
        "train.optimizer='lion' can never be suggested"),
    "when conditions in a cycle": (
        {"train.optimizer": {"type": "categorical", "choices": ["adam", "sgd"],
                             "when": {"train.lr": 0.001}},
         "train.lr": {"type": "float", "low": 0.001, "high": 0.01,
                      "when": {"train.optimizer": "sgd"}}}, "in a cycle"),
    "when not a mapping": (
        {**SPACE, "train.momentum": {"type": "float", "low": 0.8, "high": 0.99,
                                     "when": "sgd"}}, "when: expected a mapping"),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_space_exits_2_before_any_trial(tmp_path, case):
    space, words = INVALID[case]
    exp = experiment(tmp_path, "bad", space=space)
    journal = tmp_path / "optuna.journal"
    proc = run_in_process("tune", str(exp), "--storage", str(journal),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("accel: error: search."), proc.stderr
    assert words in lines[0]
    assert not journal.exists() and not (tmp_path / "mlflow.db").exists(), "nothing may start"


# --- one study, every trial outcome ------------------------------------------------------------


class ForcedPruner:
    """Prunes trial 2 at its first report and raises an out-of-memory error inside trial 3's
    run (as a GPU would mid-epoch); other trials are never pruned."""

    def prune(self, study, trial) -> bool:
        import torch

        if trial.number == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated by the test)")
        return trial.number == 2


@pytest.fixture(scope="module")
def study5(tmp_path_factory):
    """5 trials: 0 the file's values COMPLETE, 1 NaN loss FAIL, 2 PRUNED, 3 OOM FAIL, 4 COMPLETE."""
    import optuna

    stores = Stores(tmp_path_factory.mktemp("study5"))
    exp = experiment(stores.root, "s5")
    study, _ = search.prepare(config.load(exp), "s5", stores.storage, stores.uri)
    assert len(study.trials) == 1  # the baseline, queued by prepare()
    study.enqueue_trial({"train.lr": NAN_LR})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tune_workers, "build_pruner",
                   lambda *a: type("P", (ForcedPruner, optuna.pruners.BasePruner), {})())
        assert stores.tune(exp, "s5", "--n-trials", "5") == 0
    return stores, exp


EXPECTED = [("COMPLETE", "FINISHED"), ("FAIL", "FAILED"), ("PRUNED", "KILLED"),
            ("FAIL", "FAILED"), ("COMPLETE", "FINISHED")]


def test_study_has_one_parent_and_one_child_run_per_trial(study5):
    stores, _ = study5
    study = stores.study("s5")
    trials = study.trials[:5]
    assert [t.state.name for t in trials] == [state for state, _ in EXPECTED]
    assert "NonFiniteLoss" in trials[1].user_attrs["accel.error"]
    assert "OutOfMemoryError" in trials[3].user_attrs["accel.error"]
    assert trials[0].user_attrs.get("accel.baseline") and trials[0].params["train.lr"] == 3.0e-3

    runs = stores.runs("s5")
    parents = role(runs, "study")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["accel.study"] == "s5"
    assert study.user_attrs["accel.parent_run_id"] == parent.info.run_id
    children = {int(r.data.tags["optuna.trial_number"]): r for r in role(runs, "trial")
                if int(r.data.tags["optuna.trial_number"]) < 5}
    assert sorted(children) == [0, 1, 2, 3, 4]
    for number, (state, status) in enumerate(EXPECTED):
        run = children[number]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.run_name == f"trial-{number:03d}"
        assert run.data.tags["accel.study"] == "s5"
        assert (run.data.tags["optuna.trial_state"], run.info.status) == (state, status), number
        assert trials[number].user_attrs["mlflow_run_id"] == run.info.run_id
    # Params: the whole resolved config, with the trial's own values.
    done = children[4]
    assert done.data.params["model.name"] == "test_resnet"
    assert done.data.params["data.dataset"] == "digits"
    assert float(done.data.params["train.lr"]) == pytest.approx(trials[4].params["train.lr"])
    history = stores.client().get_metric_history(done.info.run_id, "val_accuracy")
    assert [m.step for m in history] == [1, 2]  # one point per epoch
    assert float(children[1].data.params["train.lr"]) == NAN_LR


def test_parent_run_shows_the_best_trial_and_the_plots(study5):
    stores, _ = study5
    study = stores.study("s5")
    client = stores.client()
    parent = role(stores.runs("s5"), "study")[0]
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)
    assert parent.data.tags["best_trial"] == str(study.best_trial.number)
    assert parent.info.status == "FINISHED"
    files = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "best_params.json", "plots", "config.yaml"} <= files
    plots = {f.path for f in client.list_artifacts(parent.info.run_id, "plots")}
    for name in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert {f"plots/{name}.html", f"plots/{name}.png"} <= plots, plots
    csv = Path(client.download_artifacts(parent.info.run_id, "trials.csv")).read_text()
    assert len(csv.strip().splitlines()) == 1 + len(study.trials)


def test_best_prints_the_best_complete_trial_and_how_to_reproduce_it(study5, capsys):
    stores, _ = study5
    finished = [r for r in role(stores.runs("s5"), "trial")
                if r.data.tags["optuna.trial_state"] == "COMPLETE"]
    best = max(finished, key=lambda r: r.data.metrics["val_accuracy"])
    capsys.readouterr()
    assert main(["best", "--study", "s5", "--storage", stores.storage]) == 0
    out = capsys.readouterr().out
    assert f"mlflow run: {best.info.run_id}" in out
    assert f"accel reproduce {best.info.run_id} --tracking-uri {stores.uri}" in out
    assert f"best trial: {best.data.tags['optuna.trial_number']}" in out
    # Where the best run's last epoch went, and its MFU against the peak measured here.
    m = best.data.metrics
    said = next(line for line in out.splitlines() if line.startswith("last epoch's time: "))
    assert f"compute {100 * m['time_compute_s'] / m['epoch_wall_s']:.0f}%" in said
    assert f"MFU {m['mfu']:.3g} ({m['achieved_tflops']:.3g} of " in said


def test_rerun_with_another_direction_or_space_is_refused(study5, capsys):
    stores, exp = study5
    n = len(stores.study("s5").trials)
    capsys.readouterr()
    assert stores.tune(exp, "s5", overrides=["search.direction=minimize"]) == 2
    err = capsys.readouterr().err
    assert "search.direction" in err and "--study" in err
    space = copy.deepcopy(SPACE)
    space["train.lr"]["high"] = 0.5
    other = experiment(stores.root, "s5b", space=space)
    assert stores.tune(other, "s5") == 2
    err = capsys.readouterr().err
    assert "search.space.train.lr" in err and len(err.strip().splitlines()) == 1
    assert len(stores.study("s5").trials) == n, "a refused run must not add trials"
    # The same settings under a new study name are a new study (prepared, not run here).
    fresh, _ = search.prepare(config.load(other), "s5-other", stores.storage, stores.uri)
    assert fresh.user_attrs["accel.definition"]["space"]["train.lr"]["high"] == 0.5


def test_a_study_remembers_its_data_and_refuses_other_data(study5, capsys, tmp_path):
    """Trials on other data are not comparable: under the same study name they are refused,
    naming both; without --study the other data gets its own study and experiment."""
    from tests.conftest import make_imagefolder

    stores, exp = study5
    n = len(stores.study("s5").trials)
    assert stores.study("s5").user_attrs["accel.definition"]["data"]["dataset"] == "digits"
    folder = make_imagefolder(tmp_path / "scans", side=16, classes=2,
                              per_class={"train": 4, "test": 2})
    other = ["data.dataset=imagefolder", f"data.root={folder}"]
    capsys.readouterr()
    assert stores.tune(exp, "s5", overrides=other) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "its trials trained on dataset=digits" in err
    assert f"this run asks for dataset=imagefolder root={folder}" in err
    assert len(stores.study("s5").trials) == n, "a refused run must not add trials"
    # No --study: the name follows the data (the study is prepared, not run here).
    cfg = config.load(exp, other)
    assert cfg.name == "s5-scans"
    fresh, _ = search.prepare(cfg, cfg.name, stores.storage, stores.uri)
    assert fresh.user_attrs["accel.definition"]["data"]["root"] == str(folder)


def test_rerun_resumes_the_study_under_the_same_parent_run(study5):
    stores, exp = study5
    before = stores.study("s5")
    parent = before.user_attrs["accel.parent_run_id"]
    # A trial left RUNNING by a process that was killed (kill -9: no clean-up ran).
    orphan = before.ask()
    orphan.set_user_attr("accel.host", socket.gethostname())
    orphan.set_user_attr("accel.pid", _pid_of_finished_process())
    n = len(before.trials)
    assert stores.tune(exp, "s5", "--n-trials", "1") == 0
    after = stores.study("s5")
    assert after.trials[orphan.number].state.name == "FAIL", "the orphan is closed on resume"
    # Its MLflow run ends FAILED, as a dead worker's trial does on a database storage (it died
    # before train() opened one, so the clean-up opens it: every trial has exactly one run).
    [dead] = [r for r in role(stores.runs("s5"), "trial")
              if r.data.tags["optuna.trial_number"] == str(orphan.number)]
    assert dead.info.status == "FAILED" and dead.data.tags["optuna.trial_state"] == "FAIL"
    assert len(after.trials) == n + 1 and after.trials[-1].state.name == "COMPLETE"
    assert after.user_attrs["accel.parent_run_id"] == parent
    runs = stores.runs("s5")
    assert len(role(runs, "study")) == 1
    newest = [r for r in role(runs, "trial") if r.data.tags["optuna.trial_number"] == str(n)]
    assert len(newest) == 1 and newest[0].data.tags["mlflow.parentRunId"] == parent


def _pid_of_finished_process() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- worker processes and Ctrl-C ---------------------------------------------------------------


# make test covers it: two spawned workers on one journal and one SQLite store, each trial once
# under the study's run, a worker's lines on the invocation's stderr, no "database is locked":
# tests/test_study_signals.py::
#     test_a_worker_killed_with_sigkill_has_its_trial_retried_from_its_checkpoint
@pytest.mark.slow
def test_two_workers_share_six_trials_exactly_once(tmp_path, capfd):
    """The invocation runs in this process; its two workers are spawned processes, whose
    output reaches this process's stderr (capfd reads both)."""
    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "w2")
    code = stores.tune(exp, "w2", "--n-trials", "6", "--workers", "2")
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert "[worker 0] " in err and "[worker 1] " in err, err[-3000:]  # both workers' lines
    assert "database is locked" not in err
    trials = stores.study("w2").trials
    assert len(trials) == 6
    assert sorted(t.number for t in trials) == list(range(6))
    assert all(t.state.is_finished() for t in trials), [t.state for t in trials]
    assert len({t.user_attrs["accel.pid"] for t in trials}) == 2, "both workers ran trials"
    runs = stores.runs("w2")
    children = role(runs, "trial")
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == list(range(6))
    assert len(role(runs, "study")) == 1
    parent = role(runs, "study")[0].info.run_id
    assert all(r.data.tags["mlflow.parentRunId"] == parent for r in children)
    assert not [r for r in runs if r.info.status == "RUNNING"]


# make test covers it: a larger run of what test_two_workers_share_six_trials_exactly_once checks
@pytest.mark.slow
def test_four_workers_forty_trials_on_one_sqlite_store_and_one_journal(tmp_path):
    """Contention: 4 processes write one SQLite MLflow store and one journal file at once. No
    trial is lost or run twice, every trial has exactly one run, and no "database is locked"
    failure reaches anyone."""
    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "w4", space={"train.lr": SPACE["train.lr"]}, pruner="none")
    data = yaml.safe_load(exp.read_text())
    data["train"].update(epochs=1, epoch_length=2)
    exp.write_text(yaml.safe_dump(data))
    proc = run_cli("tune", str(exp), "--study", "w4", "--storage", stores.storage,
                   "--tracking-uri", stores.uri, "--n-trials", "40", "--workers", "4",
                   timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "database is locked" not in proc.stderr + proc.stdout
    trials = stores.study("w4").trials
    assert sorted(t.number for t in trials) == list(range(40))
    assert all(t.state.name == "COMPLETE" for t in trials), [t.state.name for t in trials]
    assert len({t.user_attrs["accel.pid"] for t in trials}) == 4, "all four workers ran trials"
    runs = stores.runs("w4")
    children = role(runs, "trial")
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == list(range(40))
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == {r.info.run_id for r in children}
    assert all(r.info.status == "FINISHED" for r in children)
    assert len(role(runs, "study")) == 1 and not [r for r in runs if r.info.status == "RUNNING"]


def test_ctrl_c_leaves_nothing_running_and_the_rerun_resumes(tmp_path):
    stores = Stores(tmp_path)
    # A long first trial (many short epochs), so the interrupt lands inside it.
    exp = experiment(tmp_path, "cc")
    data = yaml.safe_load(exp.read_text())
    data["train"]["epochs"] = 200
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    # Ctrl-C is a SIGINT to this process, sent once trial 0 has logged an epoch.
    poller = threading.Thread(target=_interrupt_when_training, args=(stores, "cc"), daemon=True)
    poller.start()
    assert stores.tune(exp, "cc", "--n-trials", "3") == 130
    poller.join()
    study = stores.study("cc")
    assert [t.state.name for t in study.trials] == ["FAIL", "WAITING"]  # stopped: queued again
    runs = stores.runs("cc")
    assert {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status)
                                                         for r in runs]
    assert role(runs, "trial")[0].data.tags["optuna.trial_state"] == "FAIL"
    # Rerunning the same command continues the study under the same parent run.
    data["train"]["epochs"] = 2
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    assert stores.tune(exp, "cc", "--n-trials", "1") == 0
    study = stores.study("cc")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert len(role(stores.runs("cc"), "study")) == 1


def _interrupt_when_training(stores: Stores, name: str, timeout: float = 300.0) -> None:
    """SIGINT this process once trial 0's MLflow run has logged an epoch (inside train())."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            runs = role(stores.runs(name), "trial")
            if runs and stores.client().get_metric_history(runs[0].info.run_id, "val_loss"):
                os.kill(os.getpid(), signal.SIGINT)
                return
        except Exception:  # the store or the experiment is not there yet
            pass


# --- PostgreSQL storage ------------------------------------------------------------------------


def test_postgres_storage_runs_and_retries_a_dead_workers_trial(tmp_path, postgres_url,
                                                               monkeypatch, capsys):
    import optuna

    # Heartbeats every second; a trial silent for 2 s belongs to a dead worker.
    monkeypatch.setattr(tune_storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(tune_storage, "GRACE_S", 2)
    # Trust auth ignores the password: it is here to check that it is never shown or logged.
    postgres_url = postgres_url.replace("postgres@", "postgres:s3cret-pw@")
    stores = Stores(tmp_path)
    exp = experiment(tmp_path, "pg")
    study, plan = search.prepare(config.load(exp), "pg", postgres_url, stores.uri)
    storage = study._storage
    assert storage.get_heartbeat_interval() == 1
    # A worker that took the first trial, chose its values, beat once, then died.
    dead = study.ask()
    search.trial_config(plan.cfg, plan.dims, dead)
    storage.record_heartbeat(dead._trial_id)
    time.sleep(3)
    assert main(["tune", str(exp), "--study", "pg", "--storage", postgres_url,
                 "--tracking-uri", stores.uri, "--n-trials", "1"]) == 0
    study = optuna.load_study(study_name="pg", storage=search.open_storage(postgres_url))
    states = [t.state.name for t in study.trials]
    assert states == ["FAIL", "COMPLETE"], states
    retried = study.trials[1]
    assert retried.system_attrs.get("failed_trial") == 0
    assert retried.params == dead.params  # the same values, run again
    tune_out, tune_err = capsys.readouterr()
    assert main(["best", "--study", "pg", "--storage", postgres_url]) == 0
    out, err = capsys.readouterr()
    out, err = tune_out + out, tune_err + err
    assert "best trial: 1" in out and retried.user_attrs["mlflow_run_id"] in out
    assert "postgres:***@127.0.0.1" in out + err
    logged = [v for r in stores.runs("pg") for v in (*r.data.tags.values(),
                                                      *r.data.params.values())]
    assert not [v for v in logged if "s3cret-pw" in v]
    assert "s3cret-pw" not in out + err


def test_storage_password_is_never_printed(tmp_path, capfd):
    """In this process: the command's own output, and (capfd) whatever loggers write."""
    exp = experiment(tmp_path, "pw")
    url = "postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere"
    capfd.readouterr()
    proc = run_in_process("tune", str(exp), "--study", "pw", "--storage", url,
                          "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = capfd.readouterr()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "s3cret-pw" not in proc.stderr + proc.stdout + logged.err + logged.out
    assert "someone:***@127.0.0.1" in proc.stderr
