"""`accel reproduce`: rebuild a logged run (from config.yaml or from params), rerun it, compare.

On one CPU stack a rerun is bitwise identical, so the tests compare final metrics exactly.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from accel import cli, config, config_params, reproduce
from accel.tracking import Tracker, environment_diff
from accel.tracking.client import _param_value
from accel.tracking.store import open_store
from tests.conftest import ROOT, TINY_OVERRIDES, run_cli

COMPARED = ("val_accuracy", "val_f1", "val_loss", "train_loss")
# Each test trains its run and its rerun: one epoch of the tiny run is enough to compare.
ONE_EPOCH = (*TINY_OVERRIDES, "train.epochs=1")


def _train_into(directory: Path, experiment: str | None = None,
                extra: tuple[str, ...] = ()) -> SimpleNamespace:
    from accel.train import train

    cfg = config.load(None, [*ONE_EPOCH, *extra])
    cfg.tracking.uri = f"sqlite:///{directory / 'mlflow.db'}"
    cfg.tracking.experiment = experiment
    result = train(cfg)
    return SimpleNamespace(
        uri=cfg.tracking.uri, dir=directory, run_id=result.run_id, metrics=result.metrics, cfg=cfg
    )


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> SimpleNamespace:
    """One tiny tracked run, its artifacts where MLflow logged them."""
    return _train_into(tmp_path_factory.mktemp("store"))


def _initialised_store(original: SimpleNamespace, to: Path) -> Path:
    """A copy of an existing store: creating a new sqlite store costs seconds of migrations."""
    shutil.copytree(original.dir, to)
    return to


@pytest.fixture(scope="module")
def moved(original, tmp_path_factory) -> SimpleNamespace:
    """A tiny run whose store was moved: the absolute artifact path MLflow logged is gone."""
    before = _initialised_store(original, tmp_path_factory.mktemp("move") / "before")
    run = _train_into(before, experiment="moved")
    target = before.parent / "after"
    shutil.move(before, target)
    run.dir, run.uri, run.logged_dir = target, f"sqlite:///{target / 'mlflow.db'}", before
    return run


def _copy_store(run: SimpleNamespace, to: Path) -> SimpleNamespace:
    shutil.copytree(run.dir, to)
    return SimpleNamespace(**{**vars(run), "dir": to, "uri": f"sqlite:///{to / 'mlflow.db'}"})


def _client(uri: str):
    return Tracker(uri).client


def _reruns_of(uri: str, run_id: str):
    client = _client(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.`accel.reproduces` = '{run_id}'")


def _assert_rerun_stayed_in_store(run: SimpleNamespace, rerun) -> None:
    """A copied store's reruns write beside it, not to the absolute folder logged elsewhere."""
    client = _client(run.uri)
    assert client.get_experiment(rerun.info.experiment_id).name == "moved-reproduced"
    assert Path(rerun.info.artifact_uri.removeprefix("file://")).is_relative_to(run.dir)
    assert not run.logged_dir.exists()


def _artifact(run: SimpleNamespace, name: str) -> Path:
    [path] = run.dir.glob(f"artifacts/*/{run.run_id}/artifacts/{name}")
    return path


def test_reproduce_is_exact_and_tagged(original, capsys):
    code = cli.main(["reproduce", original.run_id, "--tracking-uri", original.uri])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reproduced: val_accuracy" in out and "(exactly)" in out
    assert re.search(r"^val_loss\s", out, re.M), out  # the table

    [rerun] = _reruns_of(original.uri, original.run_id)
    client = _client(original.uri)
    logged = client.get_run(original.run_id)
    assert rerun.info.status == "FINISHED"
    assert rerun.info.experiment_id == logged.info.experiment_id
    assert rerun.info.run_name == f"reproduce-{original.run_id[:8]}-seed0"
    assert rerun.data.tags["accel.config_source"] == "config.yaml"
    for name in COMPARED:  # bitwise: same CPU stack, same seeds
        assert rerun.data.metrics[name] == logged.data.metrics[name], name
    assert rerun.data.params == logged.data.params  # the whole config came back


def test_a_run_with_the_fast_recipes_ingredients_reproduces_exactly(original, tmp_path, capsys):
    """Dirac init, multi-crop TTA, the BatchNorm settings, the whitened first layer (refitted
    from the data), the moving average, alternating flips, the scaled logits and the triangle
    schedule's ends (airbench's ingredients) come back
    from the logged config: the rerun's metrics are bitwise the run's."""
    store = _initialised_store(original, tmp_path / "store")
    run = _train_into(store, experiment="ingredients",
                      extra=("train.epochs=2",  # the whitening bias held after epoch 1
                             "model.name=accel_cnn_s", "model.dirac_init=true",
                             "eval.tta=multicrop", "model.bn_momentum=0.4",
                             "train.bn_bias_lr_scale=64", "train.bn_weight_frozen=true",
                             "model.whiten=2", "model.whiten_images=100",
                             "train.whiten_bias_epochs=1", "train.ema_decay=0.9",
                             "model.head_scale=0.111", "train.lr_start=0.2",
                             "train.lr_end=0.07", "train.warmup_epochs=0.5",
                             "data.on_device=true", "data.flip=alternating"))
    logged = _client(run.uri).get_run(run.run_id)
    assert logged.data.params["model.dirac_init"] == "True"
    assert logged.data.params["eval.tta"] == "multicrop"
    assert logged.data.params["train.bn_bias_lr_scale"] == "64.0"
    assert logged.data.params["model.whiten"] == "2"
    assert logged.data.params["train.ema_decay"] == "0.9"
    assert logged.data.params["model.head_scale"] == "0.111"
    assert cli.main(["reproduce", run.run_id, "--tracking-uri", run.uri]) == 0
    assert "(exactly)" in capsys.readouterr().out
    [rerun] = _reruns_of(run.uri, run.run_id)
    for name in COMPARED:
        assert rerun.data.metrics[name] == logged.data.metrics[name], name


def test_downloaded_config_yaml_reruns_exactly(original, tmp_path, capsys):
    client = _client(original.uri)
    path = client.download_artifacts(original.run_id, "config.yaml", str(tmp_path))
    assert cli.main(["train", path, "--tracking-uri", original.uri]) == 0
    new_id = re.search(r"^run (\w+):", capsys.readouterr().out, re.M).group(1)
    new, logged = client.get_run(new_id), client.get_run(original.run_id)
    assert new_id != original.run_id
    for name in COMPARED:
        assert new.data.metrics[name] == logged.data.metrics[name], name


def test_config_from_params_inverts_logging():
    """Every value type survives str() -> MLflow -> cast back, search space included."""
    cfg = config.load(
        ROOT / "experiments/quickstart.yaml", ["train.clip_grad_norm=1.5", "data.train_limit=100"]
    )
    cfg.search.space = {
        "train.lr": {"type": "float", "low": 1e-5, "high": 0.1, "log": True},
        "train.optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
        "train.accumulation_steps": {"type": "int", "low": 1, "high": 4},
    }
    params = {k: _param_value(v) for k, v in cfg.flat().items()}
    params.update({"effective_batch_size": "64", "resolved.device": "cpu"})  # not config keys
    rebuilt, notes = config_params.from_params(params)
    assert rebuilt == cfg
    assert notes == []


def test_config_from_params_reports_schema_drift():
    params = {k: _param_value(v) for k, v in config.Config().flat().items()}
    del params["train.lr"]
    params["train.old_knob"] = "3"
    rebuilt, notes = config_params.from_params(params)
    assert rebuilt.train.lr == config.TrainConfig().lr
    assert any("train.old_knob" in n for n in notes)
    assert any("train.lr" in n and "defaults" in n for n in notes)


def test_store_copied_without_artifacts_rebuilds_from_params(moved, tmp_path):
    """Only the database travelled: no config.yaml, no environment.json; params suffice."""
    (tmp_path / "db").mkdir()
    shutil.copy(moved.dir / "mlflow.db", tmp_path / "db" / "mlflow.db")
    tracker = open_store(f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}")
    got = reproduce.load_original(tracker, moved.run_id)
    assert got.source == "params"
    assert got.config.flat() == {**moved.cfg.flat(), "tracking.uri": None}  # the URL is not logged
    assert got.environment is None
    assert any("not on this machine" in n for n in got.notes)
    assert any("rebuilt from its logged params" in n for n in got.notes)


def test_reproduce_from_params_when_config_artifact_deleted(moved, tmp_path, capsys):
    run = _copy_store(moved, tmp_path / "copy")
    _artifact(run, "config.yaml").unlink()
    code = cli.main(["reproduce", run.run_id, "--tracking-uri", run.uri])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "using the copy beside this store" in captured.err  # environment.json was found
    assert "rebuilt from its logged params" in captured.err
    [rerun] = _reruns_of(run.uri, run.run_id)
    assert rerun.data.tags["accel.config_source"] == "params"
    _assert_rerun_stayed_in_store(run, rerun)
    for name in COMPARED:
        assert rerun.data.metrics[name] == moved.metrics[name], name


def test_changed_setting_outside_tolerance_exits_3(moved, tmp_path, capsys):
    """The logged config.yaml is edited (lr x100): the rerun misses the original, exit 3."""
    run = _copy_store(moved, tmp_path / "copy")
    path = _artifact(run, "config.yaml")
    data = yaml.safe_load(path.read_text())
    data["train"]["lr"] *= 100
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    code = cli.main(["reproduce", run.run_id, "--tracking-uri", run.uri])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "NOT reproduced: val_accuracy" in out
    for row in ("val_accuracy", "val_f1", "val_loss", "epoch_time_s"):
        assert re.search(rf"^{row}\b.*\d", out, re.M), out
    [rerun] = _reruns_of(run.uri, run.run_id)  # the failed attempt is logged all the same
    _assert_rerun_stayed_in_store(run, rerun)
    assert float(rerun.data.params["train.lr"]) == moved.cfg.train.lr * 100
    assert abs(rerun.data.metrics["val_accuracy"] - moved.metrics["val_accuracy"]) > 0.005


def test_unknown_run_id_exits_2_with_one_line(original, capsys):
    code = cli.main(["reproduce", "0" * 32, "--tracking-uri", original.uri])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and "no run '" + "0" * 32 in lines[0], lines


def test_missing_store_exits_2_with_one_line(tmp_path):
    """Through a subprocess: nothing but the one line reaches stderr, no traceback."""
    proc = run_cli("reproduce", "abc", "--tracking-uri", f"sqlite:///{tmp_path}/none.db")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "no MLflow store" in lines[0], proc.stderr
    assert not (tmp_path / "none.db").exists()  # looking did not create an empty store


def test_environment_diff_names_each_difference():
    logged = {
        "torch": "2.14.1",
        "cuda": None,
        "seed": 0,
        "git_dirty": True,
        "gpu_count": 2,
        "packages": {"timm": "1.0.20", "mlflow": "3.17.2"},
    }
    current = {
        "torch": "2.15.0",
        "cuda": None,
        "seed": 1,
        "git_dirty": True,
        "gpu_count": 1,
        "torch_interop_threads": 2,  # recorded since: not a difference
        "packages": {"timm": "1.0.21", "mlflow": "3.17.2"},
    }
    lines = environment_diff(logged, current)
    assert any("torch: 2.14.1 in the run, 2.15.0 here" in x for x in lines)
    assert any("gpu_count: 2 in the run, 1 here" in x for x in lines)
    assert not any("interop" in x for x in lines)
    assert any("package timm: 1.0.20 in the run, 1.0.21 here" in x for x in lines)
    assert any("uncommitted" in x for x in lines)
    assert not any("seed" in x or "mlflow" in x or "cuda" in x for x in lines)


def cpuinfo(name: str, family: int, model: int, flags: str) -> str:
    block = (f"processor\t: {{n}}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n"
             f"model\t\t: {model}\nmodel name\t: {name}\nflags\t\t: fpu avx2 {flags}\n")
    return "\n".join(block.format(n=n) for n in range(2))  # two processors, a blank line between


def test_the_cpu_is_named_by_its_kind_where_a_virtual_machine_names_all_alike():
    """Zen 3 and Zen 4 guests both say 'AMD EPYC': their family and model numbers and bf16
    instructions tell them apart (the probes' caches are keyed by this name)."""
    from accel.tracking.environment import cpu_name

    zen3 = cpu_name(cpuinfo("AMD EPYC", 25, 1, "avx512f"))
    zen4 = cpu_name(cpuinfo("AMD EPYC", 25, 17, "avx512f avx512_bf16"))
    xeon = cpu_name(cpuinfo("Intel(R) Xeon(R) Platinum 8581C", 6, 207, "amx_bf16 amx_tile"))
    assert zen3 == "AMD EPYC (family 25 model 1)"
    assert zen4 == "AMD EPYC (family 25 model 17, avx512_bf16)"
    assert xeon == "Intel(R) Xeon(R) Platinum 8581C (family 6 model 207, amx_bf16)"
    assert cpu_name("") and "(" not in cpu_name("")  # no /proc/cpuinfo: the platform's name
    # A run logged when the CPU was named without its kind is not told the CPU differs.
    assert environment_diff({"cpu": "AMD EPYC"}, {"cpu": zen4}) == []
    assert environment_diff({"cpu": zen3}, {"cpu": zen4}) == [
        f"environment differs: cpu: {zen3} in the run, {zen4} here"]


def test_best_trial_of_a_study_reproduces_as_printed(original, tmp_path, capsys):
    uri = f"sqlite:///{_initialised_store(original, tmp_path / 'mlruns') / 'mlflow.db'}"
    storage = str(tmp_path / "optuna.journal")
    space = "search.space={train.lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}}"
    # Two trials: the median pruner judges nothing before three have finished.
    tune = [
        "tune",
        *ONE_EPOCH,
        space,
        "--study",
        "tiny",
        "--n-trials",
        "2",
        "--storage",
        storage,
        "--tracking-uri",
        uri,
    ]
    assert cli.main(tune) == 0
    capsys.readouterr()
    assert cli.main(["best", "--study", "tiny", "--storage", storage, "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    command = next(line for line in printed.splitlines() if "accel reproduce" in line)
    # --brief (the end of `make run`): the study, how to browse it, how to reproduce its best
    assert cli.main(["best", "--study", "tiny", "--storage", storage, "--tracking-uri", uri,
                     "--brief"]) == 0
    summary, browse, reproduce = capsys.readouterr().out.strip().splitlines()
    assert summary.startswith("study tiny: 2 trials (") and "; best val_accuracy " in summary
    # `accel`, or its path where PATH does not find it (as before `source .venv/bin/activate`)
    assert re.match(r"browse: (\S+/)?accel ui --tracking-uri ", browse), browse
    assert "#/experiments/" in browse
    assert reproduce == command
    argv = shlex.split(command[command.index("accel reproduce") :])[1:]  # as a user pastes it

    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(exactly)" in out, out
    run_id = argv[1]
    [rerun] = _reruns_of(uri, run_id)
    best = _client(uri).get_run(run_id)
    assert best.data.tags.get("accel.role") == "trial"
    for name in COMPARED:
        assert rerun.data.metrics[name] == best.data.metrics[name], name


# make test covers it: reproducing a trial: test_best_trial_of_a_study_reproduces_as_printed
@pytest.mark.slow
def test_a_multi_objective_trial_is_held_to_the_studys_objectives(original, tmp_path):
    """The trial's values are what the study scored: each objective is compared (validation
    metrics at the best epoch, exactly on one CPU stack; costs shown, not held to the
    tolerance), not search.metric, which is not one of them here."""
    import optuna

    from accel.tune.storage import open_storage

    uri = f"sqlite:///{_initialised_store(original, tmp_path / 'mlruns') / 'mlflow.db'}"
    storage = str(tmp_path / "optuna.journal")
    objectives = ("search.objectives=[{metric: val_f1, direction: maximize}, "
                  "{metric: peak_memory_mb, direction: minimize}]")
    space = "search.space={train.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}}"
    proc = run_cli("tune", *TINY_OVERRIDES, "train.epochs=3", objectives, space,
                   "search.pruner=none", "--study", "mo", "--n-trials", "1", "--storage",
                   storage, "--tracking-uri", uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [trial] = optuna.load_study(study_name="mo", storage=open_storage(storage)).trials
    proc = run_cli("reproduce", trial.user_attrs["mlflow_run_id"], "--tracking-uri", uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    row = next(line.split() for line in lines if line.startswith("val_f1 *"))
    assert float(row[2]) == pytest.approx(trial.values[0], abs=5e-5)  # the trial's own value
    assert row[3] == row[2]  # the rerun's
    assert any(line.startswith("peak_memory_mb *") for line in lines)
    verdict = lines[-1]
    assert verdict.startswith("reproduced: val_f1 ") and "(exactly)" in verdict, verdict
    assert "peak_memory_mb " in verdict and "not held to --tolerance" in verdict
    assert "val_accuracy" not in verdict  # search.metric is not an objective of this study
