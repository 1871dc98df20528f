"""What a newcomer's mistakes get back: one line, exit 2, fast, naming what was meant."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from tests.conftest import (
    ROOT,
    TINY_OVERRIDES,
    make_imagefolder,
    register_tiny_model,
    run_cli,
    run_in_process,
)

HEAVY = ("torch", "timm", "ignite", "mlflow", "optuna")


@pytest.mark.parametrize("command", ["train", "tune", "ablate"])
def test_a_bad_config_key_answers_before_the_heavy_libraries_load(command):
    """The config is checked first: a typo costs a fraction of a second, not the seconds that
    importing torch, timm, ignite, MLflow and Optuna take. `-X importtime` lists every module
    the real command imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "accel", command,
                           "train.lrr=1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "accel.config" in imported  # the listing works
    assert not sorted(m for m in imported if m.split(".")[0] in HEAVY)
    [error] = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert error.startswith("accel: error: unknown config key 'train.lrr'; did you mean train.lr")


def one_error_line(*args: str) -> str:
    """The command's one line on stderr, exit 2 (in this process: the line is what is tested)."""
    proc = run_in_process(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    return line


def test_optional_arguments_are_not_listed_as_required():
    line = one_error_line("evaluate")
    assert "required: MODEL_URI (see `accel evaluate --help`)" in line, line
    assert "[CONFIG]" not in line


@pytest.mark.parametrize("argv,meant", [
    (["tune", "--n-trails", "5"], "--n-trials"),
    (["tune", "--n-trails=5"], "--n-trials"),
    (["best", "--study", "s", "--registr", "x"], "--register"),
    (["trian"], "train"),
])
def test_a_mistyped_option_or_command_gets_what_was_meant(argv, meant):
    line = one_error_line(*argv)
    assert f"; did you mean {meant}? (see `accel" in line, line


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> tuple[str, str]:
    """digits-cnn@champion, a one-trial accel_cnn_s study's trial: (store, its run id)."""
    return register_tiny_model(tmp_path_factory.mktemp("registered"), "digits-cnn")


def test_a_runs_best_pt_loads_into_timm_as_the_docs_show(registered, tmp_path):
    """docs/mlflow.md's snippet, run as written (the store and the run id filled in) in a fresh
    process: `import accel.nets` is all timm needs to build accel_cnn_s."""
    store, run_id = registered
    text = (ROOT / "docs" / "mlflow.md").read_text()
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "accel.nets" in b]
    assert 'run_id="RUN_ID"' in snippet and "sqlite:///mlruns/mlflow.db" in snippet
    snippet = snippet.replace("RUN_ID", run_id).replace("sqlite:///mlruns/mlflow.db", store)
    check = "\nprint(tuple(model(torch.rand(2, 1, 8, 8)).shape))\n"
    proc = subprocess.run([sys.executable, "-c", snippet + check], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "(2, 10)"


@pytest.mark.parametrize("uri,names", [
    ("models:/digits-cnn@champoin", "digits-cnn has aliases @champion (version 1) and versions 1"),
    ("models:/digits@champion", "registered models: digits-cnn"),
    ("models:/digits-cnn/7", "digits-cnn has aliases @champion (version 1) and versions 1"),
])
def test_a_wrong_model_name_or_alias_names_what_the_registry_holds(registered, uri, names):
    store, _ = registered
    line = one_error_line("evaluate", uri, "--tracking-uri", store)
    assert line.startswith(f"accel: error: model {uri}: ") and line.endswith(names), line


def test_images_of_another_channel_count_are_named_expected_and_given(registered, tmp_path):
    store, _ = registered
    root = make_imagefolder(tmp_path / "rgb", side=8, classes=10, per_class={"test": 1})
    line = one_error_line("evaluate", "models:/digits-cnn@champion", "data.dataset=imagefolder",
                          f"data.root={root}", "--tracking-uri", store)
    assert line == (f"accel: error: the model takes images of 1 channel of 8x8 px; the "
                    f"imagefolder data in {root} gives 3 channels of 8x8 px"), line


# make test covers it: a stopped study's command asking for the trials left, run as printed:
# tests/test_signals.py::test_sigterm_ends_a_study_cleanly_and_the_rerun_resumes (SIGTERM; Ctrl-C
# on a study: tests/test_search.py::test_ctrl_c_leaves_nothing_running_and_the_rerun_resumes)
@pytest.mark.slow
def test_a_stopped_study_says_how_many_trials_are_left_and_the_command_that_runs_them(
        tmp_path):
    """Ctrl-C once a trial of 3 is done and another trains: the last line's command asks for
    the trials left (not 3 more) and says what became of the parent run; run as printed, it
    brings the study to 3."""
    from tests.conftest import new_store
    from tests.test_signals import start
    from tests.test_study_signals import experiment, load, one_done_and_one_training, poll

    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    where = ["--study", "q", "--storage", journal, "--tracking-uri", store]
    proc = start("tune", experiment(tmp_path, epochs=5), *where, "--n-trials", "3")

    try:
        poll(one_done_and_one_training(journal, "q"), "a trial done and one training",
             proc, every_s=0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole group
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    done = sum(t.state.name == "COMPLETE" for t in load(journal, "q").trials)
    assert 1 <= done < 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    command = re.search(r"carry the study on with: (.*?) \((\d+) of this run's 3 trial\(s\) "
                        r"left; the study's parent run ([0-9a-f]{32}) is KILLED; that command "
                        r"marks it RUNNING again", last)
    assert command, last
    assert int(command.group(2)) == 3 - done
    argv = shlex.split(command.group(1))
    assert argv[-2:] == ["--n-trials", str(3 - done)] and argv.count("--n-trials") == 1
    again = start(*argv[1:])  # `accel` as this environment runs it
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    assert sum(t.state.name == "COMPLETE" for t in load(journal, "q").trials) == 3, err[-2000:]


# make test covers it: the order of a study's lines: notices are tested in this file's others
@pytest.mark.slow
def test_a_notice_during_a_study_comes_after_the_trial_lines_not_between_them(tmp_path):
    """An epoch of a few updates (digits at train.batch_size=256, 5 updates, fewer where a trial
    accumulates) gets its notice once, after the study's trial lines."""
    tiny = [o for o in TINY_OVERRIDES if not o.startswith(("train.epoch_length", "train.batch"))]
    proc = run_cli("tune", *tiny, "train.epochs=1", "train.batch_size=256",
                   "tracking.system_metrics=false", "--study", "n", "--n-trials", "2",
                   "--storage", str(tmp_path / "optuna.journal"),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    notices = [i for i, line in enumerate(lines) if line.startswith("accel: an epoch is ")]
    trials = [i for i, line in enumerate(lines) if re.match(r"trial \d{3} ", line)]
    assert notices and len(trials) == 2, proc.stderr
    assert min(notices) > max(trials), proc.stderr
    assert len({lines[i] for i in notices}) == len(notices), proc.stderr  # each said once


def test_the_few_updates_notice_counts_a_short_last_window_as_an_update():
    """1438 images at batch 64 are 22 micro-batches; with 4 to an update the epoch makes 6
    updates (the last window of 2 micro-batches is flushed), as the run logs, not 5."""
    from types import SimpleNamespace

    from accel.train.parts import few_updates

    loader = SimpleNamespace(dataset=range(1438), batch_size=64, drop_last=True)
    assert few_updates(loader, 4, 22).startswith("an epoch is 6 update(s) (1438 training")
    assert few_updates(loader, 1, 22) is None  # 22 updates: not few


def test_a_named_study_is_not_told_that_its_runs_go_under_the_data_name(tmp_path):
    """`accel tune FILE data.root=OTHER --study NAME`: the runs go under NAME, and no note
    claims they go under `<file's name>-<data>`."""
    from tests.conftest import cli_main

    root = make_imagefolder(tmp_path / "folder", side=8, classes=2,
                            per_class={"train": 6, "test": 2})
    flags = ["--storage", str(tmp_path / "optuna.journal"),
             "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    code, _, err = cli_main("tune", *TINY_OVERRIDES, "data.dataset=imagefolder",
                            f"data.root={root}", "data.val_fraction=0.25", "train.epochs=1",
                            "--study", "named", "--n-trials", "1", *flags)
    assert code == 0, err[-2000:]
    assert "go under the name" not in err, err[-2000:]
    assert "study named:" in err
