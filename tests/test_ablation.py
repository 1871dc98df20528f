"""`accel ablate`: the combination set, what each switch really changes, the MLflow record, the
paper's grid, and (marked slow) real CIFAR-10 from ../shared/data."""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import pickle
import resource
from pathlib import Path

import pytest
import torch

from accel import ablation as A
from accel import config
from accel.ablation.split import split_table
from accel.errors import ConfigError, NonFiniteLoss
from accel.train import train
from tests.conftest import ROOT, SHARED_DATA, TINY_OVERRIDES, run_in_process

PAPER = sorted((ROOT / "experiments" / "paper").glob("cifar*.yaml"))  # the paper's grid
PAPER_FIVE = {"train.lr", "train.optimizer", "train.weight_decay", "train.clip_grad_norm",
              "train.accumulation_steps"}
CPU = torch.device("cpu")


# One intra-op thread in this process, where every ablation of this file runs: these models are
# tiny, and on a shared 2-core machine two OpenMP threads spin-waiting on each other made this file
# ~4x slower (118 s vs 29 s, measured).
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(*extra: str) -> config.Config:
    return config.load(None, [*TINY_OVERRIDES, "train.epochs=1", *extra])


def configs(cfg: config.Config, techniques: tuple[str, ...], device=CPU):
    plan = A.make_plan(cfg, techniques, device)
    return plan, {c.name: A.combination_config(cfg, c, plan) for c in A.combinations(techniques)}


# --- the combination set ---------------------------------------------------------------------


@pytest.mark.parametrize("techniques", [("ga",), ("ga", "amp", "pm"), A.TECHNIQUES,
                                        ("compile", "amp")])
def test_combinations_are_every_subset_once(techniques):
    combos = A.combinations(techniques)
    assert len(combos) == 2 ** len(techniques)
    assert len({c.on for c in combos}) == len(combos)  # no duplicates
    assert len({c.name for c in combos}) == len(combos)
    assert combos[0].on == frozenset() and combos[0].name == "baseline"
    assert combos[-1].on == frozenset(techniques)
    assert all(c.on <= set(techniques) for c in combos)
    assert [len(c.on) for c in combos] == sorted(len(c.on) for c in combos)


def test_parse_techniques_rejects_unknown_repeated_and_empty():
    assert A.parse_techniques("ga, AMP,pm") == ("ga", "amp", "pm")
    for bad, says in (("ga,fp8", "unknown 'fp8'"), ("ga,ga", "twice"), (" , ", "empty")):
        with pytest.raises(ConfigError, match=says):
            A.parse_techniques(bad)


def test_schedule_interleaves_repeats_and_reverses_every_other():
    combos = A.combinations(("ga", "amp"))
    order = A.schedule(combos, 3)
    assert [c for r, c in order if r == 0] == combos
    assert [c for r, c in order if r == 1] == combos[::-1]
    assert [r for r, _ in order] == [0] * 4 + [1] * 4 + [2] * 4


# --- each switch changes what it claims --------------------------------------------------------


def test_every_combination_keeps_data_seed_epochs_and_effective_batch():
    cfg = tiny("train.epoch_length=6", "train.lr=0.002")
    plan, by_name = configs(cfg, ("ga", "amp", "pm", "channels_last"))
    assert plan.effective_batch == 16 and plan.ga_steps == A.DEFAULT_GA_STEPS
    for name, c in by_name.items():
        t = c.train
        assert t.batch_size * t.accumulation_steps == 16, name
        assert t.epoch_length * t.batch_size == 6 * 16, name  # the same images per epoch
        assert (t.seed, t.epochs, t.lr, c.data.dataset) == (0, 1, 0.002, "digits"), name
        assert t.amp == ("bf16" if "amp" in name else "off"), name
        assert c.data.pin_memory is ("pm" in name), name
        assert t.channels_last is ("channels_last" in name), name
        assert t.accumulation_steps == (4 if "ga" in name else 1), name


def test_ga_factor_comes_from_the_config_and_must_divide():
    plan, by_name = configs(tiny("train.batch_size=8", "train.accumulation_steps=2"), ("ga",))
    assert (plan.effective_batch, plan.ga_steps) == (16, 2)
    assert (by_name["ga"].train.batch_size, by_name["baseline"].train.batch_size) == (8, 16)
    with pytest.raises(ConfigError, match="does not split into 4"):
        A.make_plan(tiny("train.batch_size=6"), ("ga",), CPU)


def test_ablated_techniques_only_the_rest_stays_as_configured():
    cfg = tiny("train.channels_last=true", "data.pin_memory=false")
    _, by_name = configs(cfg, ("amp",))
    assert all(c.train.channels_last and not c.data.pin_memory for c in by_name.values())


class MicroBatchSpy:
    """Replaces accel.engine.UpdateStep: records each micro-batch's size and each update."""

    def __init__(self, monkeypatch):
        from accel import engine

        self.sizes: list[int] = []
        self.updates_after: list[int] = []  # micro-batch count at each optimizer update
        spy = self

        class Spy(engine.UpdateStep):
            def __call__(self, eng, batch):
                spy.sizes.append(len(batch[1]))
                return super().__call__(eng, batch)

            def update(self):
                spy.updates_after.append(len(spy.sizes))
                return super().update()

        monkeypatch.setattr(engine, "UpdateStep", Spy)


def test_ga_on_means_more_micro_batches_per_update_with_the_same_effective_batch(monkeypatch):
    _, by_name = configs(tiny("train.epoch_length=3"), ("ga",))
    seen = {}
    for name in ("baseline", "ga"):
        spy = MicroBatchSpy(monkeypatch)
        train(by_name[name], track=False)
        ends = spy.updates_after
        per_update = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        seen[name] = (set(spy.sizes), set(per_update), len(spy.updates_after))
    assert seen["baseline"] == ({16}, {1}, 3)
    assert seen["ga"] == ({4}, {4}, 3)  # 4 micro-batches of 4 = the same 16 images per update


def test_amp_on_runs_the_forward_under_autocast(monkeypatch):
    from accel import models

    _, by_name = configs(tiny("train.epoch_length=2"), ("amp",))
    real = models.prepare_model
    seen: list[tuple[bool, torch.dtype]] = []

    def spying(model, cfg, device):
        model = real(model, cfg, device)
        model.register_forward_hook(
            lambda m, args, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
            if m.training else None)
        return model

    monkeypatch.setattr(models, "prepare_model", spying)
    observed = {}
    for name in ("baseline", "amp"):
        seen.clear()
        with contextlib.suppress(NonFiniteLoss):  # oneDNN bf16 backward here; the forward ran
            train(by_name[name], track=False)
        observed[name] = set(seen)
    assert observed["baseline"] == {(False, torch.float32)}
    assert observed["amp"] == {(True, torch.bfloat16)}


def test_pm_on_pins_batches_for_an_accelerator_and_is_na_on_cpu():
    from accel.data import build_data

    cfg = tiny()
    plan, by_name = configs(cfg, ("pm",), torch.device("cuda"))  # a plan made for a GPU
    assert build_data(by_name["pm"], torch.device("cuda")).train.pin_memory is True
    assert build_data(by_name["baseline"], torch.device("cuda")).train.pin_memory is False
    assert A.not_applicable(A.combinations(("pm",))[1], plan) is None

    cpu_plan, _ = configs(cfg, ("ga", "pm"))
    reasons = {c.name: A.not_applicable(c, cpu_plan) for c in A.combinations(("ga", "pm"))}
    assert reasons["baseline"] is None and reasons["ga"] is None
    assert reasons["pm"].startswith("n/a on cpu") and "same run as baseline" in reasons["pm"]
    assert "same run as ga" in reasons["ga+pm"]


def test_resident_on_puts_the_data_on_the_device_and_makes_pm_na():
    from accel.data import build_data
    from accel.resident import ResidentLoader

    assert A.parse_techniques("ga,amp,pm,resident") == ("ga", "amp", "pm", "resident")
    cfg = tiny()
    plan, by_name = configs(cfg, ("pm", "resident"), torch.device("cuda"))  # made for a GPU
    assert by_name["resident"].data.on_device and not by_name["baseline"].data.on_device
    reasons = {c.name: A.not_applicable(c, plan) for c in A.combinations(("pm", "resident"))}
    assert reasons["resident"] is None and reasons["pm"] is None
    assert "no host-to-device copies" in reasons["pm+resident"]
    assert isinstance(build_data(by_name["resident"], CPU).train, ResidentLoader)
    assert not isinstance(build_data(by_name["baseline"], CPU).train, ResidentLoader)
    cpu_plan, _ = configs(cfg, ("ga", "resident"))
    from accel.ablation.report import describe_plan

    header = describe_plan(cfg, cpu_plan, 1, "cpu")
    assert "resident on = data.on_device=true" in header and "in memory" in header


def test_ddp_on_shares_each_micro_batch_over_every_gpu_and_is_na_with_one(monkeypatch):
    from accel.ablation.report import describe_plan

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = tiny("train.epoch_length=6")  # batch 16
    plan, by_name = configs(cfg, ("ga", "ddp"), torch.device("cuda"))  # a two-GPU machine
    assert plan.ranks == 2
    shapes = {name: (c.train.batch_size, c.train.accumulation_steps, c.train.nproc_per_node,
                     c.train.epoch_length) for name, c in by_name.items()}
    assert shapes == {"baseline": (16, 1, 1, 6), "ga": (4, 4, 1, 24), "ddp": (8, 1, 2, 6),
                      "ga+ddp": (2, 4, 2, 24)}
    assert {c.train.effective_batch_size for c in by_name.values()} == {16}
    assert not any(A.not_applicable(c, plan) for c in A.combinations(("ga", "ddp")))
    assert "ddp on = 2 ranks" in describe_plan(cfg, plan, 1, "2 GPUs")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    with pytest.raises(ConfigError, match="micro-batch 4 or 16 does not split into 3 ranks"):
        A.make_plan(cfg, ("ga", "ddp"), torch.device("cuda"))

    for device, where in ((CPU, "n/a on cpu"), (torch.device("cuda"), "n/a on one GPU")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        one, by_name = configs(cfg, ("ddp",), device)
        assert one.ranks == 1 and by_name["ddp"].train.nproc_per_node == 1
        reason = A.not_applicable(A.combinations(("ddp",))[1], one)
        assert reason.startswith(where) and "same run as baseline" in reason
        assert "ddp: n/a" in describe_plan(cfg, one, 1, "here")


def test_ddp_on_trains_the_run_on_two_ranks_with_the_same_result(monkeypatch):
    """The `ddp` combination really runs data parallel (two gloo ranks here, standing in for two
    GPUs): on a model without BatchNorm it ends with the one-process run's accuracy and loss."""
    import accel.train as training
    from accel.ablation import plan as ablation_plan
    from tests.test_distributed import NO_BATCHNORM

    monkeypatch.setattr(ablation_plan, "gpus", lambda device: 2)
    seen, real = [], training.train

    def train_and_note(cfg, **kwargs):
        seen.append(cfg.train.nproc_per_node)
        return real(cfg, **kwargs)

    monkeypatch.setattr(training, "train", train_and_note)
    cfg = config.load(None, [*NO_BATCHNORM, "train.batch_size=16"])
    result = A.run_ablation(cfg, ("ddp",), 1)
    assert sorted(seen) == [1, 2]
    rows = {row.combo.name: row for row in result.rows}
    assert rows["baseline"].status == rows["ddp"].status == "ok"
    by = {r.combination: r for r in result.records}
    assert by["ddp"].val_accuracy == by["baseline"].val_accuracy
    assert by["ddp"].epochs == by["baseline"].epochs == 2


def test_time_to_target_is_tabulated_per_combination_when_a_target_is_set():
    cfg = tiny("train.target={metric: val_accuracy, value: 0.2}")
    plan = A.make_plan(cfg, ("ga",), CPU)
    records = []
    for name, per_repeat in {"baseline": [(4.0, 0.1), (5.0, 0.1)],  # reached at epoch 2
                             "ga": [(2.0, 0.2), (3.0, 0.0)]}.items():  # once at 1, never
        for r, (t, acc1) in enumerate(per_repeat):
            h = history(t, t)
            h[0]["val_accuracy"], h[1]["val_accuracy"] = acc1, acc1 + 0.1 * (name == "baseline")
            rec = A.record_from_history(A.RunRecord(name, r), h, cfg.train.target)
            rec.ok = True
            records.append(rec)
    by_name = {(r.combination, r.repeat): r for r in records}
    assert by_name["baseline", 0].time_to_target_s == 8.0  # both epochs' training time
    assert by_name["baseline", 0].epochs_to_target == 2
    assert by_name["ga", 0].time_to_target_s == 2.0
    assert math.isnan(by_name["ga", 1].epochs_to_target)
    rows = A.summarize(A.combinations(("ga",)), records, plan)
    table = A.markdown_table(rows, plan)
    assert "s to val_accuracy >= 0.2 (min–max)" in table.splitlines()[0]
    assert "| 9.0 (8.0–10.0) |" in table  # baseline: 8 and 10 s
    assert "| 2.0 (2.0–2.0), 1/2 runs |" in table
    parsed = list(csv.DictReader(io.StringIO(A.csv_table(rows, plan))))
    assert float(parsed[0]["time_to_target_s_median"]) == 9.0
    assert "time_to_target" not in A.markdown_table(rows, A.make_plan(tiny(), ("ga",), CPU))
    assert "s to " not in A.markdown_table(rows, A.make_plan(tiny(), ("ga",), CPU))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pm_on_a_gpu_moves_pinned_batches_without_blocking(monkeypatch):
    from accel import engine

    _, by_name = configs(tiny("train.device=cuda", "train.epoch_length=2"), ("pm",),
                         torch.device("cuda"))
    real, seen = engine.move_batch, []

    def spying(batch, device, non_blocking, channels_last):
        seen.append((batch[0].is_pinned(), non_blocking))
        return real(batch, device, non_blocking, channels_last)

    monkeypatch.setattr(engine, "move_batch", spying)
    for name, expected in (("baseline", {(False, False)}), ("pm", {(True, True)})):
        seen.clear()
        train(by_name[name], track=False)
        assert set(seen) == expected, name


def test_each_run_reports_its_own_peak_memory_not_the_process_one():
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("/proc/self/clear_refs is not writable here (not Linux?)")
    from accel.train.memory import keep_freed_memory

    keep_freed_memory(True)  # as every CPU run leaves the process: freed memory stays resident
    big = torch.ones(64 * 2**20)  # 256 MiB resident
    del big
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    A.reset_peak_memory(CPU)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert after < before - 200 * 1024  # KiB: the 256 MiB peak is forgotten


# --- timing and the table ---------------------------------------------------------------------


def history(*times: float) -> list[dict[str, float]]:
    return [{"epoch_time_s": t, "train_throughput": 100 / t, "peak_memory_mb": 10.0 * i,
             "val_accuracy": 0.1 * i} for i, t in enumerate(times, 1)]


def test_the_split_table_says_which_part_each_combination_moved():
    """Steady epochs' medians per part; AMP that halves compute moved compute by -50%."""
    def run(combo: str, compute: float, data: float) -> A.RunRecord:
        split = {"time_data_s": data, "time_copy_s": 0.1, "time_compute_s": compute,
                 "time_eval_s": 0.5, "time_record_s": 0.2, "time_other_s": 0.0,
                 "epoch_wall_s": data + compute + 0.8, "mfu": 0.1}
        first = {**split, "time_compute_s": 99.0}  # the first epoch is left out
        return A.record_from_history(A.RunRecord(combo, 0, ok=True), history(9.0, 2.0, 2.0),
                                     splits=[first, split, split])

    combos = {c.name: c for c in A.combinations(("amp",))}
    rows = [A.Row(combos["baseline"], "ok", [run("baseline", 4.0, 1.0)]),
            A.Row(combos["amp"], "ok", [run("amp", 2.0, 1.1)])]
    table = split_table(rows)
    assert "| baseline | 1.000 | 0.100 | 4.000 | 0.500 | 0.200 | 0.000 | 0.100 |  |" in table
    assert table.rstrip().endswith("| amp | 1.100 | 0.100 | 2.000 | 0.500 | 0.200 | 0.000 | "
                                   "0.100 | compute -2 s (-50%) |")
    assert split_table([A.Row(combos["baseline"], "ok", [A.RunRecord("baseline", 0)])]) == ""


def test_first_epoch_is_apart_and_steady_is_the_median_of_the_rest():
    rec = A.record_from_history(A.RunRecord("x", 0), history(9.0, 2.0, 4.0, 3.0))
    assert (rec.first_epoch_s, rec.steady_epoch_s, rec.epochs) == (9.0, 3.0, 4)
    assert rec.throughput == pytest.approx(100 / 3) and rec.peak_memory_mb == 40.0
    one = A.record_from_history(A.RunRecord("x", 0), history(5.0))
    assert one.steady_epoch_s == one.first_epoch_s == 5.0


def fake_records(times: dict[str, list[float | None]]) -> list[A.RunRecord]:
    out = []
    for name, per_repeat in times.items():
        for r, t in enumerate(per_repeat):
            rec = A.RunRecord(name, r)
            if t is None:
                rec.error = "NonFiniteLoss: loss became nan"
            else:
                rec = A.record_from_history(rec, history(2 * t, t))
                rec.ok = True
            out.append(rec)
    return out


def test_speedups_are_paired_by_repeat_failures_shown_and_pm_na_on_cpu():
    techniques = ("ga", "amp", "pm")
    plan = A.make_plan(tiny(), techniques, CPU)
    records = fake_records({"baseline": [10.0, 12.0, 11.0], "ga": [5.0, 6.0, 5.5],
                            "amp": [8.0, None, 11.0], "ga+amp": [None, None, None]})
    rows = {r.combo.name: r for r in A.summarize(A.combinations(techniques), records, plan)}
    assert len(rows) == 8
    assert rows["baseline"].speedup == (1.0, 1.0, 1.0)
    assert rows["ga"].speedup == pytest.approx((2.0, 2.0, 2.0))
    assert rows["amp"].status == "2/3 ok"
    assert rows["amp"].speedup == pytest.approx((1.125, 1.0, 1.25))  # 10/8 and 11/11
    assert rows["ga+amp"].status == "failed" and math.isnan(rows["ga+amp"].speedup[0])
    for name in ("pm", "ga+pm", "amp+pm", "ga+amp+pm"):
        assert rows[name].status.startswith("n/a on cpu") and not rows[name].speedups

    table = A.markdown_table(list(rows.values()), plan)
    lines = table.splitlines()
    assert len(lines) == 2 + 8
    assert "| ga | on | off | off | ok | 5.50 (5.00–6.00) | 2.00x (2.00–2.00) |" in table
    assert "NonFiniteLoss" in next(line for line in lines if line.startswith("| ga+amp |"))
    parsed = list(csv.DictReader(io.StringIO(A.csv_table(list(rows.values()), plan))))
    assert [p["combination"] for p in parsed] == list(rows)
    assert parsed[3]["pm"] == "n/a" and parsed[3]["status"] == "n/a"
    assert float(parsed[1]["speedup_median"]) == pytest.approx(2.0)
    assert float(parsed[1]["warmup_s_median"]) == pytest.approx(5.5)  # first 2t minus steady t


def test_intervals_over_repeats_say_which_differences_are_beyond_noise():
    """Planted timings and accuracies, 4 repeats: ga is faster every time with the same
    accuracy; amp's speed-up straddles 1 and its accuracy is lower every time."""
    import numpy as np
    from scipy import stats

    from accel.console import MISSING

    plan = A.make_plan(tiny(), ("ga", "amp"), CPU)
    records = fake_records({"baseline": [10.0, 12.0, 11.0, 10.5], "ga": [5.0, 6.3, 5.4, 5.1],
                            "amp": [8.0, 14.0, 11.0, 10.0], "ga+amp": [9.0, 11.0, 10.0, 10.0]})
    accuracy = {"baseline": [0.80, 0.82, 0.81, 0.80], "ga": [0.81, 0.81, 0.80, 0.81],
                "amp": [0.70, 0.71, 0.69, 0.72], "ga+amp": [0.80, 0.82, 0.81, 0.80]}
    for r in records:
        r.val_accuracy = accuracy[r.combination][r.repeat]
    rows = {r.combo.name: r for r in A.summarize(A.combinations(("ga", "amp")), records, plan)}
    assert rows["ga"].beyond_noise == "faster"
    assert rows["amp"].beyond_noise == "same speed, lower acc"
    assert rows["ga+amp"].beyond_noise == "faster"  # 10/9, 12/11, 11/10, 10.5/10: all > 1
    assert rows["baseline"].beyond_noise == MISSING

    def direct(values):  # the 95% Student-t interval of the mean, from scipy directly
        values = np.array(values)
        return stats.t.interval(0.95, len(values) - 1, loc=values.mean(),
                                scale=stats.sem(values))

    amp_speedups = [10 / 8, 12 / 14, 11 / 11, 10.5 / 10]
    speed, acc = rows["amp"].intervals()
    assert (speed.low, speed.high) == pytest.approx(tuple(direct(amp_speedups)))
    assert speed.low < 1 < speed.high
    diffs = [a - b for a, b in zip(accuracy["amp"], accuracy["baseline"], strict=True)]
    assert (acc.low, acc.high) == pytest.approx(tuple(direct(diffs))) and acc.high < 0
    table = A.markdown_table(list(rows.values()), plan)
    amp_line = next(line for line in table.splitlines() if line.startswith("| amp |"))
    assert f"[{speed.low:.2f}, {speed.high:.2f}]" in amp_line
    assert "same speed, lower acc" in amp_line
    parsed = {p["combination"]: p for p in csv.DictReader(io.StringIO(
        A.csv_table(list(rows.values()), plan)))}
    assert parsed["ga"]["beyond_noise"] == "faster"
    assert float(parsed["amp"]["acc_diff_ci_high"]) == pytest.approx(acc.high)

    one = A.summarize(A.combinations(("ga",)), fake_records({"baseline": [10.0], "ga": [5.0]}),
                      A.make_plan(tiny(), ("ga",), CPU))
    assert one[1].intervals() == (None, None)
    assert one[1].beyond_noise == "one seed: no interval"


def test_equal_accuracy_differences_over_seeds_give_no_verdict():
    """Three repeats whose accuracy differences are all +0.3 pp: no spread, so no interval
    and no accuracy verdict (a zero-width interval is no evidence)."""
    plan = A.make_plan(tiny(), ("amp",), CPU)
    records = fake_records({"baseline": [10.0, 11.0, 10.5], "amp": [10.1, 10.9, 10.6]})
    for r in records:
        r.val_accuracy = 0.5 + r.repeat * 0.01 + (0.003 if r.combination == "amp" else 0)
    rows = A.summarize(A.combinations(("amp",)), records, plan)
    assert rows[1].beyond_noise == "no (noise)"
    assert "no spread over 3 seeds: no interval" in A.markdown_table(rows, plan)


def test_a_failed_baseline_gives_no_speedups():
    plan = A.make_plan(tiny(), ("ga",), CPU)
    rows = A.summarize(A.combinations(("ga",)), fake_records({"baseline": [None],
                                                               "ga": [5.0]}), plan)
    result = A.Ablation(plan, rows, [], "", 1)
    assert not result.baseline_ok
    assert rows[1].speedups == [] and "no baseline" in A.markdown_table(rows, plan)


# --- through the CLI, into MLflow ----------------------------------------------------------------


def test_cli_ablation_logs_a_parent_with_one_child_per_combination(store, tmp_path):
    from mlflow.tracking import MlflowClient

    proc = run_in_process("ablate", *TINY_OVERRIDES, "train.epochs=1", "train.epoch_length=2",
                          "--techniques", "ga,amp,pm", "--repeats", "1", "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| baseline |" in proc.stdout and "n/a on cpu" in proc.stdout
    # Where each combination's steady epoch went, and the part it moved against the baseline.
    split = proc.stdout[proc.stdout.index("Where a steady epoch's time went"):]
    amp_row = next(line for line in split.splitlines() if line.startswith("| amp |"))
    assert len(amp_row.split("|")) == 11 and amp_row.rstrip(" |").endswith("%)"), amp_row

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("accel.role") == "ablation"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["tracking.uri"] == "null"  # logged by log_config, store not kept
    assert parent.data.params["ablation.techniques"] == "ga,amp,pm"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    names = {c.info.run_name for c in children}
    # n/a on cpu: a row of the table and a note on the parent, not an empty run
    assert names == {"baseline", "ga", "amp", "ga+amp"}
    assert "n/a on cpu" in parent.data.tags["accel.ablation.not_applicable"]

    for child in children:
        name = child.info.run_name
        grandchildren = [r for r in runs
                         if r.data.tags.get("mlflow.parentRunId") == child.info.run_id]
        status = child.data.tags["accel.ablation.status"]
        # Every other combination must really run on CPU, GA and bf16 AMP included.
        assert status == "ok", (name, child.data.tags.get("mlflow.note.content"))
        assert len(grandchildren) == 1  # one repeat
        ran = grandchildren[0]
        assert ran.data.tags["accel.role"] == "train"
        assert (ran.info.status, child.info.status) == ("FINISHED", "FINISHED"), name
        assert child.data.metrics["steady_epoch_s"] > 0, name
        assert ran.data.params["train.batch_size"] == ("4" if "ga" in name else "16")
        assert ran.data.params["train.amp"] == ("bf16" if "amp" in name else "off")

    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"ablation.md", "ablation.csv", "ablation_runs.csv", "speedup.png",
            "config.yaml", "environment.json"} <= artifacts
    table = Path(client.download_artifacts(parent.info.run_id, "ablation.csv", str(tmp_path)))
    rows = {row["combination"]: row for row in csv.DictReader(table.open())}
    assert len(rows) == 8 and next(iter(rows)) == "baseline"
    assert float(rows["baseline"]["speedup_median"]) == 1.0
    for name in ("baseline", "ga", "amp", "ga+amp"):
        assert rows[name]["status"] == "ok", name
        assert math.isfinite(float(rows[name]["speedup_median"])), name
        assert float(rows[name]["speedup_median"]) > 0, name


def test_repeats_train_with_seeds_of_their_own_and_get_honest_intervals(store):
    """3 repeats on a CPU: repeat r trains with seed r in every combination, so the accuracy
    differences vary and their intervals have width; no accuracy verdict from an interval that
    includes zero; the table names the seeds."""
    from accel.tracking import Tracker

    cfg = tiny("train.epochs=2", "train.epoch_length=3")
    result = A.run_ablation(cfg, ("amp",), 3, tracker=Tracker(store))
    seeds = {(r.combination, r.repeat): r.seed for r in result.records}
    assert seeds == {(c, r): r for c in ("baseline", "amp") for r in range(3)}
    from mlflow.tracking import MlflowClient

    logged = {r.data.tags["accel.ablation.repeat"]: r.data.params["train.seed"]
              for r in MlflowClient(store).search_runs(
                  [MlflowClient(store).get_experiment_by_name("quickstart").experiment_id],
                  "tags.`accel.ablation.combination` = 'amp' AND tags.`accel.role` = 'train'")}
    assert logged == {"1": "0", "2": "1", "3": "2"}
    amp = result.rows[1]
    base_acc = sorted(r.val_accuracy for r in result.rows[0].ok)
    assert len(set(base_acc)) > 1, "the baseline's repeats differ: their own seeds"
    _, accuracy = amp.intervals()
    assert accuracy.n == 3 and accuracy.high > accuracy.low
    if accuracy.contains(0.0):
        assert "acc" not in amp.beyond_noise
    assert "seeds 0..2, one per repeat" in result.header


def test_one_seed_says_no_interval(store):
    from accel.tracking import Tracker

    result = A.run_ablation(tiny("train.epochs=2", "train.epoch_length=2"), ("amp",), 1,
                            tracker=Tracker(store))
    assert result.rows[1].beyond_noise == "one seed: no interval"
    assert "one seed: no interval" in result.markdown()


def test_missing_data_exits_2_before_any_experiment_or_run(store, tmp_path):
    """The paper file's own command without its data: one line, exit 2, and MLflow is left
    as it was (no experiment, no FAILED parent or combination runs)."""
    from mlflow.tracking import MlflowClient

    proc = run_in_process("ablate", str(PAPER[0]), f"data.root={tmp_path / 'nowhere'}",
                          "train.epochs=2", "--repeats", "2", "--tracking-uri", store)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("accel: error: data.root=") and "Traceback" not in proc.stderr
    names = {e.name for e in MlflowClient(store).search_experiments()}
    assert names <= {"Default"}, names
    assert MlflowClient(store).search_runs(
        [e.experiment_id for e in MlflowClient(store).search_experiments()]) == []


def test_several_files_make_one_grid_with_a_summary_and_a_verdict_per_technique(store,
                                                                                  tmp_path):
    """Two experiment files: one grid parent, one ablation under it per file, a summary row
    per technique with one cell per file, and a verdict line per technique."""
    from mlflow.tracking import MlflowClient

    files = []
    for name, model in (("grid-a", "test_resnet"), ("grid-b", "test_vit")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nmodel: {{name: {model}}}\n")
        files.append(str(path))
    proc = run_in_process("ablate", *files, *TINY_OVERRIDES[:1], *TINY_OVERRIDES[2:],
                          "train.epochs=2", "train.epoch_length=2", "--techniques", "amp,pm",
                          "--repeats", "2", "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = proc.stdout.split("## the grid")[1]
    amp = next(line for line in summary.splitlines() if line.startswith("| amp |"))
    assert amp.count("x [") == 2, amp  # a speed-up with its interval for each file
    assert "- **pm**: not applicable here (n/a on cpu" in summary
    assert "- **amp**: " in summary
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ablation-grid").experiment_id],
                              max_results=200)
    (grid,) = [r for r in runs if r.data.tags.get("accel.role") == "ablation-grid"]
    ablations = [r for r in runs if r.data.tags.get("accel.role") == "ablation"]
    assert {r.data.tags["mlflow.parentRunId"] for r in ablations} == {grid.info.run_id}
    assert sorted(r.info.run_name.split(":")[0] for r in ablations) == ["grid-a", "grid-b"]
    assert grid.info.status == "FINISHED"
    assert "grid.md" in {a.path for a in client.list_artifacts(grid.info.run_id)}
    assert "browse: " in proc.stdout and "/grid.md" in proc.stdout


def test_the_parent_run_never_logs_the_store_url_or_its_password(store):
    """A store URL may hold a password: the ablation's parent logs its config through
    `log_config`, which keeps `tracking.uri` out of the params and config.yaml."""
    from mlflow.tracking import MlflowClient

    from accel.tracking import Tracker

    secret = "postgresql://accel:s3cr3t@db.invalid:5432/mlflow"
    cfg = tiny("train.epoch_length=1", f"tracking.uri={secret}")
    result = A.run_ablation(cfg, ("pm",), 1, tracker=Tracker(store))  # cpu: baseline only
    assert [r.ok for r in result.records] == [True]

    client = MlflowClient(store)
    parent = client.get_run(result.parent_run_id)
    assert parent.data.params["tracking.uri"] == "null"
    config_yaml = client.download_artifacts(result.parent_run_id, "config.yaml")
    text = Path(config_yaml).read_text()
    assert "uri: null" in text and "s3cr3t" not in text
    exp = client.get_experiment(parent.info.experiment_id)
    for run in client.search_runs([exp.experiment_id]):
        assert "s3cr3t" not in repr(run.data.params), run.info.run_name


def test_cli_rejects_an_unknown_technique_with_exit_2(store):
    proc = run_in_process("ablate", *TINY_OVERRIDES, "--techniques", "ga,fp8",
                          "--tracking-uri", store)
    assert proc.returncode == 2
    assert "unknown 'fp8'" in proc.stderr and "Traceback" not in proc.stderr


# --- the paper's grid -----------------------------------------------------------------------------


def test_the_paper_grid_is_complete():
    names = {p.stem for p in PAPER}
    assert names == {f"{d}_{m}" for d in ("cifar10", "cifar100")
                     for m in ("resnet50", "vit", "efficientnet")}


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_file_header_and_search_space(path: Path):
    from accel.tune import check_search

    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    assert f"accel tune experiments/paper/{path.name}" in header
    assert "expect" in header and "GPU" in header and "paper (Nokhwal et al., 2023)" in header
    assert "CPU:" in header  # its cost measured on a named CPU, or why it was not
    cfg = config.load(path)
    assert cfg.data.dataset == path.stem.split("_")[0]
    dims = {dim.key: dim for dim in check_search(cfg)}
    assert set(dims) == PAPER_FIVE | {"train.momentum"}
    assert dims["train.momentum"].when == (("train.optimizer", ("sgd",)),)  # momentum: sgd only
    if "vit" in path.stem:  # 4x4-pixel patches of the 32x32 original: an 8x8 token grid
        assert "patch8" in cfg.model.name and cfg.model.img_size == 64


def test_rq2_file_is_a_two_objective_study_over_the_three_families():
    from accel.tune import check_search

    path = ROOT / "experiments" / "paper" / "rq2_tradeoff.yaml"
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    assert "accel tune experiments/paper/rq2_tradeoff.yaml" in header and "--pick" in header
    cfg = config.load(path)
    assert config.objectives(cfg.search) == [("val_accuracy", "maximize"),
                                             ("train_time_s", "minimize")]
    dims = {dim.key: dim for dim in check_search(cfg)}
    assert PAPER_FIVE | {"model.name", "model.img_size", "train.momentum"} == set(dims)
    names = dims["model.name"].choices
    assert all(any(n.startswith(f) for n in names) for f in ("resnet", "vit", "efficientnet"))
    vits = {n for n in names if n.startswith("vit")}
    assert dims["model.img_size"].when == (("model.name", tuple(sorted(vits, key=names.index))),)


@pytest.fixture(scope="module")
def fake_cifar(tmp_path_factory) -> Path:
    """Tiny CIFAR-10 and CIFAR-100 in torchvision's python format (checksums are patched)."""
    import numpy as np

    root = tmp_path_factory.mktemp("cifar")
    rng = np.random.default_rng(0)

    def batch(n: int, classes: int, key: str) -> dict:
        return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                key: [i % classes for i in range(n)]}

    def dump(path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(obj))

    c10 = root / "cifar-10-batches-py"
    for i in range(1, 6):
        dump(c10 / f"data_batch_{i}", batch(8, 10, "labels"))
    dump(c10 / "test_batch", batch(10, 10, "labels"))
    dump(c10 / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    c100 = root / "cifar-100-python"
    dump(c100 / "train", batch(200, 100, "fine_labels"))
    dump(c100 / "test", batch(100, 100, "fine_labels"))
    dump(c100 / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    return root


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_file_smoke_runs_one_short_epoch_on_its_own_dataset(path, fake_cifar, monkeypatch):
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda p, md5=None: os.path.isfile(p))
    family = next(f for f in ("resnet", "vit", "efficientnet") if f in path.stem)
    cfg = config.load(path, [f"model.name=test_{family}", f"data.root={fake_cifar}",
                             "train.epochs=1", "train.epoch_length=2", "train.batch_size=8",
                             "train.device=cpu", "data.num_workers=0"])
    result = train(cfg, track=False)
    assert result.epochs == 1
    assert "test_accuracy" in result.metrics  # the CIFAR test split was read: the file's dataset


# --- real CIFAR-10 from ../shared/data (slow) ----------------------------------------------


@pytest.fixture(scope="module")
def cifar10_root() -> Path:
    """The extracted shared CIFAR-10; skipped when absent, but a failure under CI=true."""
    if not SHARED_DATA.exists():
        message = f"{SHARED_DATA} is absent (real CIFAR-10 lives beside the repo, not in it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so a missing data path must not pass as a skip")
        pytest.skip(message)
    from accel.shared_data import cifar10_jpeg

    return cifar10_jpeg(SHARED_DATA)


@pytest.mark.slow
def test_shared_cifar10_is_the_full_imagefolder_tree(cifar10_root):
    for split, per_class in (("train", 5000), ("test", 1000)):
        classes = sorted(p.name for p in (cifar10_root / split).iterdir())
        assert len(classes) == 10 and "airplane" in classes
        assert len(list((cifar10_root / split / "cat").glob("*.jpg"))) == per_class


def cifar10_subset(root: Path, folder: Path, train: int, test: int) -> Path:
    """The first `train` and `test` images of each class of the real tree, linked, not copied:
    the same pictures, without decoding and scoring all 60,000."""
    for split, n in (("train", train), ("test", test)):
        for cls in sorted(p.name for p in (root / split).iterdir()):
            (folder / split / cls).mkdir(parents=True)
            for image in sorted((root / split / cls).glob("*.jpg"))[:n]:
                (folder / split / cls / image.name).symlink_to(image)
    return folder


@pytest.mark.slow
def test_real_cifar10_ablation_learns_and_tabulates(cifar10_root, tmp_path):
    subset = cifar10_subset(cifar10_root, tmp_path / "cifar10", train=500, test=100)
    cfg = config.load(ROOT / "experiments" / "cifar10_cpu.yaml", [
        f"data.root={subset}", "data.train_limit=4096", "train.epochs=2",
        "train.warmup_epochs=0"])
    result = A.run_ablation(cfg, ("ga", "pm"), 1)  # no tracker: numbers only
    rows = {r.combo.name: r for r in result.rows}
    assert rows["baseline"].status == "ok" and rows["ga"].status == "ok"
    assert rows["pm"].status.startswith("n/a on cpu")
    base, ga = rows["baseline"], rows["ga"]
    assert base.median("val_accuracy") > 0.2 and ga.median("val_accuracy") > 0.2  # chance: 0.1
    # One repeat: exactly one paired speed-up, baseline steady time / ga steady time.
    assert [r.repeat for r in base.records] == [r.repeat for r in ga.records] == [0]
    assert base.records[0].steady_epoch_s > 0 and ga.records[0].steady_epoch_s > 0
    assert len(ga.speedups) == 1
    assert math.isclose(ga.speedups[0],
                        base.records[0].steady_epoch_s / ga.records[0].steady_epoch_s)
    assert ga.speedup == (ga.speedups[0],) * 3


def test_the_grid_verdict_reads_each_models_intervals():
    """Planted speed-ups and accuracy differences over 3 seeds: faster everywhere is 'turn on',
    faster on some and slower on others 'depends on the model', slower where it is not within
    noise 'leave off', an accuracy loss beyond noise 'leave off' whatever the speed, one seed
    'no verdict'."""
    from accel.ablation.grid import Grid, verdict
    from accel.ablation.plan import Combination

    def ablation(technique, speedups, diffs):
        combo = Combination(("ga",), frozenset({technique}))
        return A.Ablation(None, [A.Row(combo, "ok", [], speedups, diffs)], [], "", 3)

    def grid(*cells):
        return Grid([f"m{i}" for i in range(len(cells))],
                    [ablation("ga", s, d) for s, d in cells], ("ga",))

    flat = [0.01, -0.01, 0.0]
    assert verdict("ga", grid(([1.2, 1.3, 1.25], flat), ([1.5, 1.4, 1.45], flat))).startswith(
        "turn on: faster on every model (m0 1.25x, m1 1.45x)")
    assert verdict("ga", grid(([1.2, 1.3, 1.25], flat), ([0.6, 0.61, 0.62], flat))) == (
        "depends on the model: turn on for m0 1.25x; leave off for m1 0.61x")
    assert verdict("ga", grid(([0.7, 0.72, 0.74], flat), ([0.9, 1.1, 1.0], flat))) == (
        "leave off: slower on m0 0.72x; within noise for m1 1.00x; faster on none")
    assert verdict("ga", grid(([1.2, 1.3, 1.25], [-0.05, -0.06, -0.04]))) == (
        "leave off: lower accuracy on m0 (beyond noise)")
    assert verdict("ga", grid(([1.2], [0.0]))).startswith("no verdict: one seed")
