"""train.budget_s: the schedule laid over a wall-clock training budget. Real runs end within the
budget plus one update with the learning rate at the schedule's end; a slower machine runs fewer
updates in the same budget; `accel reproduce` replays the logged plan exactly; `accel resume`
carries the plan on. The planning itself is checked on a fake clock. The runs read a clock, not
their process: they run in this one, but for the slower machines (processes of their own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from accel.config import TrainConfig
from accel.schedule import Schedule
from accel.train import budget as B
from tests.conftest import ROOT, TINY_OVERRIDES, new_store, run_in_process

BUDGET_S = 6.0
LR, LR_END = 0.01, 0.1
BUDGETED = [*TINY_OVERRIDES, "train.epoch_length=30", "train.scheduler=linear",
            f"train.lr={LR}", f"train.lr_end={LR_END}", "train.warmup_epochs=0.5",
            f"train.budget_s={BUDGET_S}", "tracking.system_metrics=false"]


def client(store: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store)


def only_run(store: str, role: str = "train"):
    c = client(store)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()],
                         f"tags.`accel.role` = '{role}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def plan_of(store: str, run_id: str, tmp_path) -> dict:
    dest = tmp_path / run_id
    dest.mkdir(parents=True, exist_ok=True)
    return json.loads(open(client(store).download_artifacts(run_id, B.ARTIFACT, str(dest))).read())


def curve(store: str, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(store).get_metric_history(run_id, name))


def assert_on_time_and_at_the_end(store: str, run, plan: dict) -> None:
    """Training ended within the budget plus its last update, after most of the budget (the
    stop comes when another update would not fit), with the lr at the schedule's end; the run
    logged the epochs and updates it used, each epoch once."""
    m = run.data.metrics
    assert "update_time_s" in m, (plan, m)  # measured before the budget ran out
    assert m["train_time_s"] <= BUDGET_S + m["last_update_time_s"] + 0.05, m
    assert m["train_time_s"] >= BUDGET_S - 2 * m["update_time_s"] - 0.05, m
    assert curve(store, run.info.run_id, "lr")[-1][1] == pytest.approx(LR * LR_END, rel=1e-9)
    epochs = [s for s, _ in curve(store, run.info.run_id, "val_loss")]
    assert epochs == list(range(1, int(m["train_epochs"]) + 1))
    assert m["train_updates"] == plan["updates"] == plan["revisions"][-1][1]


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory):
    """A budgeted run: (store, run, its plan, a folder, its stderr)."""
    tmp = tmp_path_factory.mktemp("budgeted")
    store = new_store(tmp)
    out = run_in_process("train", *BUDGETED, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr[-3000:]
    run = only_run(store)
    return store, run, plan_of(store, run.info.run_id, tmp), tmp, out.stderr


def test_a_budgeted_run_ends_on_time_with_its_schedule_at_its_end(budgeted):
    store, run, plan, _, _ = budgeted
    assert_on_time_and_at_the_end(store, run, plan)
    assert plan["budget_s"] == BUDGET_S and not plan["replayed"]
    # the nominal plan (2 epochs of 30 updates) was revised to what the budget holds
    assert plan["revisions"][0] == [0, 60] and len(plan["revisions"]) >= 2
    assert run.data.params["train.budget_s"] == str(BUDGET_S)


def test_each_epoch_says_one_line_with_the_training_clock_where_no_terminal_shows_a_bar(budgeted):
    """Output to a file or a batch job's log (not a terminal): one line an epoch, its plan, the
    training seconds spent of the budget and its metrics, the last one at the full plan."""
    _, run, _, _, err = budgeted
    lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    epochs = int(run.data.metrics["train_epochs"])
    assert len(lines) == epochs, err[-3000:]
    trained = 0.0
    for n, line in enumerate(lines, 1):
        head, clock = line.split(" (")[0], line.split(" (")[1].split(" of ")
        assert head.startswith(f"epoch {n}/") and clock[1].startswith(f"{BUDGET_S:g} s trained)")
        assert float(clock[0]) >= trained and "val_accuracy=" in line
        trained = float(clock[0])
    assert lines[-1].startswith(f"epoch {epochs}/{epochs} ")
    assert trained == pytest.approx(run.data.metrics["train_time_s"], abs=0.51)


# `accel ARGS` whose every optimizer update takes SLOW_S seconds longer: a slower machine.
SLOWED = """
import os, sys, time
from accel import engine
real = engine.UpdateStep.update
def update(self):
    time.sleep(float(os.environ["SLOW_S"]))
    return real(self)
engine.UpdateStep.update = update
from accel.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # also covered by make test: the plan's revision: this file's other budget tests
def test_a_slower_machine_runs_fewer_updates_in_the_same_budget(budgeted, tmp_path):
    """One OpenMP thread and two, and the fixture's run with every update made slower: each
    ends on time with its schedule at its end. The slowed run trains fewer updates than the
    fixture's; of the thread counts, the one that measured the clearly slower update (two
    threads can be the slower on a machine shared with other work) trains fewer."""
    _, ref_run, _, _, _ = budgeted
    ref = ref_run.data.metrics
    runs = {}
    for name, command, env in (
            ("one-thread", [sys.executable, "-m", "accel"], {"OMP_NUM_THREADS": "1"}),
            ("two-threads", [sys.executable, "-m", "accel"], {"OMP_NUM_THREADS": "2"}),
            ("slowed", [sys.executable, "-c", SLOWED], {"SLOW_S": str(2 * ref["update_time_s"])})):
        store = new_store(tmp_path / name)
        out = subprocess.run([*command, "train", *BUDGETED, "--tracking-uri", store], cwd=ROOT,
                             env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        run = only_run(store)
        assert_on_time_and_at_the_end(store, run, plan_of(store, run.info.run_id, tmp_path))
        runs[name] = run.data.metrics
    assert runs["slowed"]["train_updates"] < ref["train_updates"]
    slower, faster = sorted([runs["one-thread"], runs["two-threads"]],
                            key=lambda m: m["update_time_s"], reverse=True)
    if slower["update_time_s"] > 1.5 * faster["update_time_s"]:
        assert slower["train_updates"] < faster["train_updates"]


def test_reproduce_replays_the_logged_plan_exactly(budgeted):
    """The rerun trains the original's updates and epochs on the original's plan (the clock is
    not read), so its curves and final metrics are bitwise the original's."""
    store, run, plan, tmp, _ = budgeted
    out = run_in_process("reproduce", run.info.run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(exactly)" in out.stdout and f"{plan['updates']} updates in" in out.stderr
    rerun = only_run(store, "reproduce")
    rid = rerun.info.run_id
    replayed = plan_of(store, rid, tmp)
    assert replayed["revisions"] == plan["revisions"] and replayed["replayed"]
    for name in ("train_updates", "train_epochs", "val_accuracy", "val_loss", "train_loss"):
        assert rerun.data.metrics[name] == run.data.metrics[name], name
    for name in ("lr", "val_loss", "train_loss"):
        assert curve(store, rid, name) == curve(store, run.info.run_id, name), name


def test_resume_carries_the_plan_on_from_where_it_stopped(tmp_path):
    """Stopped as SIGTERM stops it after epoch 1's checkpoint, the run is carried on by `accel
    resume`: its plan begins with the revisions the checkpoint held, the time it had trained
    counts against the budget, and it ends on time with its schedule at its end."""
    from accel.train import checkpoint
    from tests.test_resume import stopped_here_after

    store = new_store(tmp_path)
    stopped = stopped_here_after(1, "train", *BUDGETED, "train.epoch_length=10",
                                 "--tracking-uri", store)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    run_id = only_run(store).info.run_id
    path = client(store).download_artifacts(run_id, "checkpoint/last-a.pt", str(tmp_path))
    state = checkpoint.load(path)
    held = state["scheduler"]["lr_lambdas"][0]["revisions"]
    assert state["epoch"] == 1 and state["updates"] == 10

    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "after epoch 1 of " in out.stderr and "within train.budget_s=6" in out.stderr
    run = client(store).get_run(run_id)
    assert run.info.status == "FINISHED"
    plan = plan_of(store, run_id, tmp_path)
    assert plan["revisions"][:len(held)] == held
    assert all(start > 10 for start, _ in plan["revisions"][len(held):])
    assert plan["updates"] > 10
    assert_on_time_and_at_the_end(store, run, plan)


# --- the planning, on a fake clock --------------------------------------------------------------


class FakeRun:
    """A Budget told of updates that do nothing but count, and a clock that moves `update_s`
    per update (the run's clock: epochs done, evaluation excluded, then this one)."""

    def __init__(self, monkeypatch, budget_s: float, update_s: float, per_epoch: int = 10,
                 epochs: int = 2):
        t = TrainConfig(epochs=epochs, scheduler="linear", budget_s=budget_s, lr_end=0.1)
        self.schedule = Schedule(t, per_epoch)
        self.budget = B.Budget(self.schedule)
        self.now, self.update_s = 0.0, update_s
        self.trainer = SimpleNamespace(state=SimpleNamespace(epoch=1, max_epochs=epochs),
                                       ended=False)
        self.step = SimpleNamespace(updates=0)
        self.history: list[float] = []  # each epoch's training seconds
        self.epoch_t0 = 0.0

    def trained_s(self) -> float:
        return sum(self.history) + self.now - self.epoch_t0

    def after_update(self) -> None:
        state = self.trainer.state
        plan = self.budget.after_update(self.step.updates, state.epoch, self.trained_s)
        if plan is not None:
            state.max_epochs, ends_now = plan
            self.trainer.ended |= ends_now

    def start_epoch(self) -> None:
        self.epoch_t0 = self.now
        self.budget.start_epoch(self.step.updates, self.trained_s())

    def run(self, max_updates: int = 10_000) -> int:
        per_epoch = self.schedule.per_epoch
        self.start_epoch()
        while self.step.updates < max_updates:
            self.now += self.update_s
            self.step.updates += 1
            self.after_update()
            state = self.trainer.state
            if self.trainer.ended or (self.step.updates % per_epoch == 0
                                      and state.epoch >= state.max_epochs):
                return self.step.updates
            if self.step.updates % per_epoch == 0:  # the epoch's row, then the next epoch
                self.history.append(self.now - self.epoch_t0)
                self.now += 5.0  # an evaluation: not training time
                state.epoch += 1
                self.start_epoch()
        raise AssertionError("never stopped")


def test_the_plan_is_what_fits_the_budget_and_ends_on_an_update(monkeypatch):
    """10 s of 1/8 s updates in epochs of 7 (and 5 s of evaluation after each, not counted):
    80 updates, the last inside epoch 12, which ends there and is evaluated."""
    fake = FakeRun(monkeypatch, budget_s=10.0, update_s=0.125, per_epoch=7)
    assert fake.run() == 80
    assert fake.trainer.ended and fake.trainer.state.max_epochs == fake.trainer.state.epoch == 12
    assert fake.schedule(80) == 0.1  # the lr's end, after the last update
    first = B.UNMEASURED_UPDATES + B.MEASURED_UPDATES  # the first estimate, then no change
    assert fake.schedule.revisions == [[0, 14], [first, 80]]  # from 2 nominal epochs of 7


def test_a_last_epoch_of_a_few_updates_is_not_started(monkeypatch):
    """Epochs of 100 updates of 1/8 s in 25.25 s: 202 would fit, the last 2 in an epoch of
    their own, which would cost an evaluation for 2% of an epoch; the run ends after epoch 2."""
    fake = FakeRun(monkeypatch, budget_s=25.25, update_s=0.125, per_epoch=100)
    assert fake.run() == 200
    assert fake.trainer.state.epoch == fake.trainer.state.max_epochs == 2
    assert fake.schedule.total == 200 and fake.schedule(200) == 0.1
    # 3 updates (3% of an epoch) are worth their epoch: 25.375 s end inside epoch 3
    fake = FakeRun(monkeypatch, budget_s=25.375, update_s=0.125, per_epoch=100)
    assert fake.run() == 203 and fake.trainer.ended and fake.trainer.state.epoch == 3


def test_a_machine_that_slows_down_is_stopped_by_the_clock(monkeypatch):
    fake = FakeRun(monkeypatch, budget_s=10.0, update_s=0.125, per_epoch=7)
    real = fake.after_update

    def slowing() -> None:
        if fake.step.updates > 40:
            fake.now += 0.125  # from here each update takes twice as long
        real()

    fake.after_update = slowing
    used = fake.run()
    assert used == 60  # 5 s for 40 updates, then 5 s of 1/4 s ones
    assert fake.schedule.total == 60 and fake.schedule(60) == 0.1
    assert len(fake.schedule.revisions) > 2  # revised as the clock said


def test_a_plan_shorter_than_the_nominal_one_ends_early(monkeypatch):
    fake = FakeRun(monkeypatch, budget_s=1.0, update_s=0.125, per_epoch=100)
    assert fake.run() == 8  # inside the first epoch
    assert fake.trainer.ended and fake.trainer.state.max_epochs == 1


def test_a_replayed_plan_gives_the_same_multipliers_and_end_without_the_clock(monkeypatch):
    fake = FakeRun(monkeypatch, budget_s=10.0, update_s=0.125)
    used = fake.run()
    t = TrainConfig(epochs=2, scheduler="linear", budget_s=10.0, lr_end=0.1)
    replay = Schedule(t, 10, fake.schedule.revisions, replay=True)
    assert [replay(u) for u in range(used + 1)] == [fake.schedule(u) for u in range(used + 1)]
    again = FakeRun(monkeypatch, budget_s=10.0, update_s=5.0)  # a clock that would stop it
    again.schedule.__dict__.update(replay.__dict__)
    assert again.run() == used


def test_the_warm_up_and_the_bias_hold_are_shares_of_the_plan():
    t = TrainConfig(epochs=10, warmup_epochs=2, whiten_bias_epochs=1, budget_s=60.0,
                    scheduler="linear")
    s = Schedule(t, per_epoch=10)
    s.revise(5, 400)  # the budget holds 400 updates: 20% warm-up, hold after 10%
    assert s.warmup_at(s.total_at(5)) == 80
    assert not s.hold_due(39) and s.hold_due(40)
    fixed = Schedule(TrainConfig(epochs=10, warmup_epochs=2), per_epoch=10)
    assert fixed.warmup_at(fixed.total) == 20 and fixed.total == 100


def test_the_schedule_travels_in_the_schedulers_state():
    """A checkpoint holds the plan (LambdaLR keeps a callable object's fields), loadable with
    weights_only=True."""
    import io

    from accel.schedule import build_scheduler

    t = TrainConfig(epochs=2, budget_s=30.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = build_scheduler(opt, t, epoch_length=10)
    scheduler.lr_lambdas[0].revise(7, 123)
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    buffer.seek(0)
    fresh = build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), t, 10)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert fresh.lr_lambdas[0].revisions == [[0, 20], [7, 123]]


def test_bad_budgets_are_refused_in_one_line():
    out = run_in_process("train", *TINY_OVERRIDES, "train.budget_s=0")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "accel: error: train.budget_s=0.0: must be > 0 (seconds of training) or null "
        "(train.epochs)")
    out = run_in_process("train", *TINY_OVERRIDES, "train.budget_s=5", "train.nproc_per_node=2")
    assert out.returncode == 2 and "train.budget_s=5.0: is measured by one process" in out.stderr


def test_each_trial_of_a_study_trains_to_the_budget(tmp_path):
    """train.budget_s in a study's config: every trial is laid over the same training budget
    (its epochs the ones that fit), ends on time and logs its plan."""
    from tests.conftest import cli_main

    store = new_store(tmp_path)
    code, _, err = cli_main(
        "tune", *BUDGETED, "train.budget_s=2", "search.pruner=none",
        "search.space={train.lr: {type: float, low: 0.005, high: 0.02}}", "--study", "b",
        "--n-trials", "2", "--storage", str(tmp_path / "optuna.journal"),
        "--tracking-uri", store)
    assert code == 0, err[-3000:]
    c = client(store)
    trials = c.search_runs([e.experiment_id for e in c.search_experiments()],
                           "tags.`accel.role` = 'trial'")
    assert len(trials) == 2
    for run in trials:
        m = run.data.metrics
        assert m["budget_s"] == 2.0
        assert m["train_time_s"] <= 2.0 + m["last_update_time_s"] + 0.05, m
        assert plan_of(store, run.info.run_id, tmp_path)["updates"] == m["train_updates"]
