"""train.amp=auto on a CPU: the faster of bf16 and fp32 by a probe of this model's update step,
cached per machine, model and batch, logged, and replayed by `accel reproduce` and `accel resume`
(whatever a probe would say there and then)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from accel import config
from accel.train import amp_probe
from tests.conftest import TINY_OVERRIDES, cli_main, new_store, run_cli

AUTO = [*TINY_OVERRIDES, "train.amp=auto", "tracking.system_metrics=false"]
OUTCOMES = {"bf16": {"fp32": 0.02, "bf16": 0.01}, "off": {"fp32": 0.01, "bf16": 0.02}}
RESOLVED = {"bf16": "bfloat16", "off": "off"}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def forced(monkeypatch, outcome: str) -> list:
    """The probe answers `outcome`'s timings (seconds per update); returns its calls."""
    calls = []

    def probe(model, cfg, device, shape, classes, rounds=amp_probe.ROUNDS):
        calls.append(shape)
        return dict(OUTCOMES[outcome])

    monkeypatch.setattr(amp_probe, "probe", probe)
    return calls


@pytest.mark.parametrize("outcome", ["bf16", "off"])
def test_auto_trains_in_what_the_probe_found_faster_and_reproduce_keeps_it(
        outcome, monkeypatch, tmp_path, cache_dir):
    from mlflow.tracking import MlflowClient

    from accel.train import train

    calls = forced(monkeypatch, outcome)
    cfg = config.load(None, [*AUTO, "train.epochs=1"])  # a run in the chosen precision
    cfg.tracking.uri = new_store(tmp_path)
    run_id = train(cfg).run_id
    assert calls == [(16, 1, 16, 16)]  # the run's batch: 16 gray 16 px digits
    run = MlflowClient(cfg.tracking.uri).get_run(run_id)
    assert run.data.params["train.amp"] == "auto"
    assert run.data.params["resolved.amp"] == RESOLVED[outcome]
    assert run.data.tags["accel.amp_auto"] == outcome
    assert run.data.tags["accel.amp_probe"] == "measured"
    times = OUTCOMES[outcome]
    assert run.data.metrics["amp_probe_fp32_s"] == times["fp32"]
    assert run.data.metrics["amp_probe_bf16_s"] == times["bf16"]
    [entry] = json.loads((cache_dir / "amp_probe.json").read_text()).values()
    assert entry == {"choice": outcome, "fp32_s": times["fp32"], "bf16_s": times["bf16"],
                     "margin": amp_probe.MARGIN}
    assert run.data.metrics["amp_probe_margin"] == amp_probe.MARGIN

    # Here and now the probe would choose the other: the rerun still trains in the original's.
    (cache_dir / "amp_probe.json").unlink()
    forced(monkeypatch, "off" if outcome == "bf16" else "bf16")
    code, out, err = cli_main("reproduce", run_id, "--tracking-uri", cfg.tracking.uri)
    assert code == 0, err
    assert f"train.amp=auto chose {outcome} in run {run_id}" in err
    assert "(exactly)" in out
    reruns = MlflowClient(cfg.tracking.uri).search_runs(
        [run.info.experiment_id], f"tags.`accel.reproduces` = '{run_id}'")
    [rerun] = reruns
    assert rerun.data.params["resolved.amp"] == RESOLVED[outcome]
    assert rerun.data.tags["accel.amp_probe"] == "replayed"
    assert rerun.data.params == run.data.params


def test_the_answer_is_cached_per_machine_model_and_batch(monkeypatch):
    calls = forced(monkeypatch, "bf16")
    cfg = config.load(None, AUTO)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                torch.nn.LazyLinear(10))
    cpu = torch.device("cpu")
    first = amp_probe.decide("auto", cpu, model, cfg, (8, 3, 8, 8), 10)
    again = amp_probe.decide("auto", cpu, model, cfg, (8, 3, 8, 8), 10)
    assert (first.how, first.mode, again.how, again.mode) == ("measured", "bf16", "cached", "bf16")
    assert (again.fp32_s, again.bf16_s) == (0.02, 0.01)
    other_batch = amp_probe.decide("auto", cpu, model, cfg, (16, 3, 8, 8), 10)
    assert other_batch.how == "measured" and len(calls) == 2
    key = amp_probe.cache_key(model, cfg, (8, 3, 8, 8))
    assert f"torch {torch.__version__}" in key and f"{torch.get_num_threads()} threads" in key
    assert amp_probe.decide("bf16", cpu, model, cfg, (8, 3, 8, 8), 10).how == "asked"
    assert amp_probe.decide("off", cpu, model, cfg, (8, 3, 8, 8), 10).dtype is None
    assert len(calls) == 2


def test_the_probe_times_both_precisions_and_leaves_the_run_as_it_was():
    """A real probe of a small model: seconds per update in each precision; the model's weights
    and the process's random state are as they were (the run trains from them)."""
    from accel.models import build_model

    cfg = config.load(None, AUTO)
    model = build_model(cfg, 10, 1, 16)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    times = amp_probe.probe(model, cfg, torch.device("cpu"), (16, 1, 16, 16), 10, rounds=1)
    decisive = set(times) == {"fp32", "bf16"}  # the warm steps answered
    assert decisive or set(times) == {"fp32", "bf16", "spread"}
    assert all(times[k] > 0 for k in ("fp32", "bf16"))
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("fp32_s, bf16_s, rounds_run", [
    (0.010, 0.150, False),  # bf16 15x slower: a CPU without bf16 instructions (AVX2 only)
    (0.010, 0.004, False),  # bf16 2.5x as fast
    (0.010, 0.013, True),  # 0.77x: close enough for the rounds to turn
    (0.010, 0.006, True)])  # 1.67x faster
def test_a_decisive_gap_after_warm_up_answers_without_the_rounds(
        monkeypatch, fp32_s, bf16_s, rounds_run):
    """Where one precision's warm step takes DECISIVE times the other's, the warm steps are the
    answer and no round runs; a closer gap is measured in the alternating rounds. Steps of
    fixed cost on a fake clock."""
    from types import SimpleNamespace

    clock, cost, ran = [0.0], {"fp32": fp32_s, "bf16": bf16_s}, {"fp32": 0, "bf16": 0}

    def step_of(model, cfg, device, dtype, shape, classes):
        name = "bf16" if dtype is torch.bfloat16 else "fp32"

        def step():
            ran[name] += 1
            clock[0] += cost[name]
        return step

    monkeypatch.setattr(amp_probe, "_step", step_of)
    monkeypatch.setattr(amp_probe, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    times = amp_probe.probe(None, None, torch.device("cpu"), (8, 3, 8, 8), 10)
    assert {k: times[k] for k in cost} == pytest.approx(cost)
    assert times.get("spread", 0.0) == pytest.approx(0.0)  # steps of fixed cost
    per_round = max(amp_probe.STEPS_PER_ROUND,
                    math.ceil(amp_probe.ROUND_S / max(fp32_s, bf16_s)))
    steps = amp_probe.WARMUP_STEPS + (amp_probe.ROUNDS * per_round if rounds_run else 0)
    assert ran == {"fp32": steps, "bf16": steps}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_cuda_is_bf16_where_supported_else_fp16_with_the_scaler():
    decision = amp_probe.decide("auto", torch.device("cuda"), torch.nn.Linear(2, 2),
                                config.load(None, AUTO), (2, 2), 2)
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert (decision.dtype, decision.how) == (expected, "cuda")


# make test covers it: the chosen precision kept by a rerun:
# test_auto_trains_in_what_the_probe_found_faster_and_reproduce_keeps_it
@pytest.mark.slow
def test_resume_trains_in_the_precision_the_run_chose(tmp_path, cache_dir):
    """Across processes: the run never stopped, and the same run stopped after epoch 1, both
    trained in what the probe chose (the second from the cache); the cache then says the other
    precision, and `accel resume` still ends bitwise where the run never stopped ended."""
    from tests.test_resume import curves, only_run, train_stopped_after

    args = [*AUTO, "train.epochs=3"]
    env = {"ACCEL_CACHE_DIR": str(cache_dir)}
    ref_store = new_store(tmp_path / "reference")
    out = run_cli("train", *args, "--tracking-uri", ref_store, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    store = new_store(tmp_path / "stopped")
    assert train_stopped_after(1, [*args, "--tracking-uri", store]).returncode == 143

    path = cache_dir / "amp_probe.json"
    cache = json.loads(path.read_text())
    [(key, entry)] = cache.items()
    other = "off" if entry["choice"] == "bf16" else "bf16"
    path.write_text(json.dumps({key: {**entry, "choice": other}}))
    run_id = only_run(store)
    out = run_cli("resume", run_id, "--tracking-uri", store, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert curves(store, run_id) == curves(ref_store, only_run(ref_store))


@pytest.mark.parametrize("fp32_s, bf16_s, spread, choice", [
    (0.9712, 0.9449, 0.0, "off"),  # bf16 2.7% faster: within the 5% margin, fp32 stays
    (1.000, 0.900, 0.0, "bf16"),  # 10% faster: beyond it
    (1.000, 0.900, 0.15, "off"),  # 10% faster, but the rounds themselves spread by 15%
    (1.000, 0.800, 0.15, "bf16")])  # 20% faster, beyond that spread
def test_auto_switches_to_bf16_only_beyond_the_margin_and_the_probes_own_spread(
        monkeypatch, fp32_s, bf16_s, spread, choice):
    """Forced timings: a gap within `MARGIN` or within the spread of the probe's own rounds
    keeps fp32; the margin is logged with the timings."""
    def probe(model, cfg, device, shape, classes, rounds=amp_probe.ROUNDS):
        return {"fp32": fp32_s, "bf16": bf16_s, "spread": spread}

    monkeypatch.setattr(amp_probe, "probe", probe)
    cfg = config.load(None, AUTO)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10))
    decision = amp_probe.decide("auto", torch.device("cpu"), model, cfg, (8, 3, 8, 8), 10)
    assert decision.mode == choice
    assert decision.metrics()["amp_probe_margin"] == max(amp_probe.MARGIN, spread)
    assert "margin" in decision.line()
