"""The update step: accumulation arithmetic, AMP/clipping order, scheduler cadence.

Each test would fail if the order or the arithmetic of `UpdateStep` were wrong.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from ignite.engine import Events
from torch import nn

from accel import engine as E
from accel.config import TrainConfig

CPU = torch.device("cpu")


def mlp(seed: int = 0) -> nn.Module:
    """No BatchNorm: the gradient of a batch is exactly the mean of its samples' gradients."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def batches(n: int, size: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 12, generator=g), torch.randint(0, 3, (size,), generator=g))
        for _ in range(n)
    ]


def run(model, data, *, k, epochs=1, optimizer=None, scheduler=None, **kw):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.5)
    step = E.UpdateStep(
        model,
        optimizer,
        nn.CrossEntropyLoss(),
        CPU,
        accumulation_steps=k,
        scheduler=scheduler,
        **kw,
    )
    trainer = E.create_trainer(step)
    trainer.run(data, max_epochs=epochs)
    return step, optimizer


class StepSpy:
    """Wraps optimizer.step: counts calls and records the gradients each update applies."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module):
        self.calls, self.grads, self.params = 0, [], []
        inner = optimizer.step

        def step(*args, **kwargs):
            self.calls += 1
            self.grads.append([p.grad.clone() for p in model.parameters()])
            self.params.append([p.detach().clone() for p in model.parameters()])
            return inner(*args, **kwargs)

        optimizer.step = step


def test_k_micro_batches_equal_one_big_batch():
    k, b = 4, 8
    small = batches(k, b)
    big = [(torch.cat([x for x, _ in small]), torch.cat([y for _, y in small]))]
    a, c = mlp(), mlp()
    run(a, small, k=k)  # one update over 4 micro-batches of 8
    run(c, big, k=1)  # one update over one batch of 32
    for pa, pc in zip(a.parameters(), c.parameters(), strict=True):
        torch.testing.assert_close(pa, pc, rtol=1e-5, atol=1e-6)
    # and the update really moved the weights (a no-op step would also "match")
    assert not torch.allclose(next(a.parameters()), next(mlp().parameters()))


def test_ten_batches_k4_give_three_updates_last_normalised_by_two():
    model = mlp()
    data = batches(10, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    spy = StepSpy(optimizer, model)
    step, _ = run(model, data, k=4, optimizer=optimizer)

    assert spy.calls == 3 == step.updates
    # The last window holds micro-batches 9 and 10: its gradient is the mean over their 16
    # samples, i.e. their summed losses divided by 2 (not by 4).
    reference = mlp()
    with torch.no_grad():
        for p, value in zip(reference.parameters(), spy.params[2], strict=True):
            p.copy_(value)
    x = torch.cat([data[8][0], data[9][0]])
    y = torch.cat([data[8][1], data[9][1]])
    nn.CrossEntropyLoss()(reference(x), y).backward()
    for got, p in zip(spy.grads[2], reference.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-7)
    # no gradient is carried into the next epoch
    assert all(p.grad is None for p in model.parameters())


def test_windows_restart_each_epoch():
    step = E.UpdateStep(
        mlp(),
        torch.optim.SGD(mlp().parameters(), lr=0.1),
        nn.CrossEntropyLoss(),
        CPU,
        accumulation_steps=4,
    )
    windows = [step.window_of(it, 10) for it in range(1, 21)]  # two epochs of 10
    ends = [i + 1 for i, (_, last) in enumerate(windows) if last]
    assert ends == [4, 8, 10, 14, 18, 20]
    assert [size for size, _ in windows[8:10]] == [2, 2]
    assert [size for size, _ in windows[10:14]] == [4, 4, 4, 4]


def test_scheduler_steps_once_per_update():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    t = TrainConfig(epochs=2, accumulation_steps=4, scheduler="cosine", warmup_epochs=1)
    scheduler = E.build_scheduler(optimizer, t, epoch_length=10)
    spy = StepSpy(optimizer, model)
    calls = []
    inner = scheduler.step
    scheduler.step = lambda *a, **k: (calls.append(1), inner(*a, **k))[1]
    run(model, batches(10, 4), k=4, epochs=2, optimizer=optimizer, scheduler=scheduler)
    assert spy.calls == len(calls) == 6  # 3 updates per epoch, not 10 micro-batches
    # warm-up spans the first epoch's 3 updates; after the last update cosine reaches 0
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_lr_multiplier_shape():
    f = lambda u: E.lr_multiplier(u, total=10, warmup=2, kind="cosine")  # noqa: E731
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == pytest.approx(1.0)
    assert f(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(10) == pytest.approx(0.0)
    assert E.lr_multiplier(7, total=10, warmup=2, kind="constant") == 1.0


def test_linear_schedule_decays_to_zero_after_the_warm_up():
    f = lambda u: E.lr_multiplier(u, total=10, warmup=2, kind="linear")  # noqa: E731
    assert [f(0), f(1), f(2)] == [0.5, 1.0, 1.0]
    assert [f(6), f(8), f(10)] == pytest.approx([0.5, 0.25, 0.0])


def test_the_schedule_starts_and_ends_at_the_given_fractions_of_the_lr():
    """airbench's triangle: 0.2 of the lr at the first update, the peak after the warm-up,
    0.07 at the end; the optimizer sees exactly these rates."""
    model = nn.Linear(3, 2)
    t = TrainConfig(optimizer="nesterov", lr=2.0, epochs=1, scheduler="linear", warmup_epochs=0.5,
                    lr_start=0.2, lr_end=0.07)
    optimizer = E.build_optimizer(model, t)
    scheduler = E.build_scheduler(optimizer, t, epoch_length=8)  # 8 updates, 4 of warm-up
    # the rates of updates 0..7 and the one after the last
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    seen.append(optimizer.param_groups[0]["lr"])
    warm = [2.0 * (0.2 + 0.8 * u / 4) for u in (1, 2, 3, 4)]
    decay = [2.0 * (0.07 + 0.93 * (1 - p / 4)) for p in (0, 1, 2, 3, 4)]
    assert seen == pytest.approx(warm + decay)
    assert seen[0] == pytest.approx(0.4 + 0.4)  # the first update: 0.2 + 0.8 / 4 of the lr
    assert seen[-1] == pytest.approx(2.0 * 0.07)
    cosine = E.lr_multiplier(10, total=10, warmup=2, kind="cosine", start=0.2, end=0.07)
    assert cosine == pytest.approx(0.07)


def test_nesterov_is_sgd_with_nesterov_momentum_and_sgd_is_heavy_ball():
    model = nn.Linear(3, 2)
    nesterov = E.build_optimizer(model, TrainConfig(optimizer="nesterov", lr=0.1, momentum=0.8))
    plain = E.build_optimizer(model, TrainConfig(optimizer="sgd", lr=0.1, momentum=0.8))
    assert isinstance(nesterov, torch.optim.SGD) and isinstance(plain, torch.optim.SGD)
    assert [g["nesterov"] for g in nesterov.param_groups] == [True] * len(nesterov.param_groups)
    assert not any(g["nesterov"] for g in plain.param_groups)
    assert {g["momentum"] for g in nesterov.param_groups} == {0.8}


def test_flip_tta_scores_the_mean_of_the_image_and_its_mirror_logits():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 3))  # not mirror-symmetric
    x, y = torch.randn(8, 2, 4, 4), torch.randint(0, 3, (8,))
    cpu = torch.device("cpu")
    with torch.no_grad():
        mean = (model(x) + model(x.flip(-1))) / 2
    plain = E.create_evaluator(model, 3, cpu).run([(x, y)]).metrics
    flip = E.create_evaluator(model, 3, cpu, tta="flip").run([(x, y)]).metrics
    assert flip["loss"] == pytest.approx(nn.functional.cross_entropy(mean, y).item(), rel=1e-6)
    assert plain["loss"] == pytest.approx(nn.functional.cross_entropy(model(x), y).item(),
                                          rel=1e-6)
    assert flip["loss"] != pytest.approx(plain["loss"])


def test_multicrop_tta_weighs_six_views_as_airbench_does():
    """1/4 each for the image and its mirror, 1/8 each for the image moved 1 px up-left and
    1 px down-right (reflect padding) and their mirrors; the views are made here by indexing,
    not by the padding the code uses."""
    torch.manual_seed(0)
    side = 5
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * side * side, 3))  # sees every pixel
    x, y = torch.randn(8, 2, side, side), torch.randint(0, 3, (8,))
    up_left = [1, *range(side - 1)]  # row/column i of the moved image is i-1; -1 reflects to 1
    down_right = [*range(1, side), side - 2]
    views = {
        "image": (x, 1 / 4),
        "moved up-left": (x[:, :, up_left][:, :, :, up_left], 1 / 8),
        "moved down-right": (x[:, :, down_right][:, :, :, down_right], 1 / 8),
    }
    with torch.no_grad():
        expected = sum(w * (model(v) + model(v.flip(-1))) for v, w in views.values())
        assert torch.allclose(E.tta_logits(model, x, "multicrop"), expected, atol=1e-6)
        assert torch.allclose(E.tta_logits(model, x, "flip"), (model(x) + model(x.flip(-1))) / 2)
        assert torch.equal(E.tta_logits(model, x, "none"), model(x))
        shifted = sum(w * (model(v) + model(v.flip(-1))) for name, (v, w) in views.items()
                      if name != "image")
        assert not torch.allclose(shifted, views["image"][1] * 2 * model(x))  # views differ
    scored = E.create_evaluator(model, 3, torch.device("cpu"), tta="multicrop").run([(x, y)])
    assert scored.metrics["loss"] == pytest.approx(
        nn.functional.cross_entropy(expected, y).item(), rel=1e-6)


def test_fp16_order_unscale_clip_step_update_zero_grad_schedule(monkeypatch):
    """unscale_ once per update, before the clip; the clip sees unscaled gradients."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1.0)
    log: list[str] = []
    seen_norms: list[float] = []

    def spy(obj, name, record=None):
        inner = getattr(obj, name)

        def wrapper(*args, **kwargs):
            log.append(name)
            if record:
                record(*args)
            return inner(*args, **kwargs)

        monkeypatch.setattr(obj, name, wrapper)

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **k):
        params = list(params)
        log.append("clip")
        seen_norms.append(
            float(
                torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
                )
            )
        )
        return real_clip(params, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    for obj, name in [
        (scaler, "unscale_"),
        (scaler, "step"),
        (scaler, "update"),
        (optimizer, "zero_grad"),
        (scheduler, "step"),
    ]:
        spy(obj, name)

    data = batches(4, 8)
    # reference: the true (unscaled) gradient of the first window, same fp16 autocast
    ref = copy.deepcopy(model)
    with torch.autocast("cpu", torch.float16):
        loss = sum(nn.CrossEntropyLoss()(ref(x), y) for x, y in data[:2]) / 2
    loss.backward()
    true_norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()]))

    step, _ = run(
        model,
        data,
        k=2,
        optimizer=optimizer,
        scheduler=scheduler,
        amp_dtype=torch.float16,
        scaler=scaler,
        clip_grad_norm=1e-3,
    )
    one_update = ["unscale_", "clip", "step", "update", "zero_grad", "step"]
    assert log == one_update * 2
    assert seen_norms[0] == pytest.approx(true_norm, rel=1e-2)  # scaled would be 1024x larger
    assert scaler.get_scale() == 2.0**10  # finite gradients: no update was skipped


def test_clip_limits_the_applied_gradient_and_reports_the_norm_before():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    spy = StepSpy(optimizer, model)
    outputs = []
    step = E.UpdateStep(model, optimizer, nn.CrossEntropyLoss(), CPU, clip_grad_norm=0.01)
    trainer = E.create_trainer(step)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output))
    trainer.run(batches(2, 8), max_epochs=1)
    applied = [float(torch.nn.utils.get_total_norm(g)) for g in spy.grads]
    assert all(n == pytest.approx(0.01, rel=1e-4) for n in applied)
    assert all(float(o["grad_norm"]) > 0.05 for o in outputs)  # the pre-clip norm, reported


def test_bf16_autocast_without_scaler():
    assert E.build_scaler(torch.bfloat16, CPU) is None
    assert E.build_scaler(None, CPU) is None
    assert isinstance(E.build_scaler(torch.float16, CPU), torch.amp.GradScaler)
    assert E.resolve_amp("bf16", CPU) is torch.bfloat16
    assert E.resolve_amp("off", CPU) is None
    assert E.resolve_amp("auto", CPU) is None  # fp32 on CPU, see engine.resolve_amp

    model = mlp()
    dtypes = []
    model[1].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    step, _ = run(model, batches(2, 8), k=1, amp_dtype=torch.bfloat16)
    assert step.scaler is None and step.updates == 2
    assert dtypes == [torch.bfloat16, torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_guarded_conv_on_one_pixel_gets_the_fp32_weight_gradient_under_cpu_bf16():
    """oneDNN's bf16 weight gradient is wrong for a 3x3 stride-2 conv on a 1x1 input (taps that
    see only padding get garbage, now and then NaN: bench/bf16_cpu_conv.py). Guarded, every
    repeat gives the fp32 gradient, whose off-centre taps are exactly zero."""
    torch.manual_seed(0)
    conv = nn.Conv2d(64, 32, 3, stride=2, padding=1, bias=False)
    x = torch.randn(4, 64, 1, 1)
    reference = torch.autograd.grad(conv(x).sum(), conv.weight)[0]
    E.guard_cpu_bf16_convs(conv)
    for _ in range(50):
        with E.autocast(torch.device("cpu"), torch.bfloat16):
            out = conv(x)
        grad = torch.autograd.grad(out.float().sum(), conv.weight)[0]
        assert out.dtype == torch.float32  # the guard ran this conv outside autocast
        assert torch.equal(grad, reference)
    off_centre = torch.ones(3, 3, dtype=torch.bool)
    off_centre[1, 1] = False
    assert torch.count_nonzero(grad[:, :, off_centre]) == 0


def test_guard_leaves_larger_inputs_in_bf16_and_comes_off():
    conv = nn.Conv2d(8, 8, 3, padding=1)
    E.guard_cpu_bf16_convs(conv)
    with E.autocast(torch.device("cpu"), torch.bfloat16):
        assert conv(torch.randn(2, 8, 4, 4)).dtype == torch.bfloat16
        assert conv(torch.randn(2, 8, 1, 1)).dtype == torch.float32
    E.unguard_convs(conv)
    assert "forward" not in conv.__dict__
    with E.autocast(torch.device("cpu"), torch.bfloat16):
        assert conv(torch.randn(2, 8, 1, 1)).dtype == torch.bfloat16


def test_epoch_stats_average_loss_and_count_samples():
    model = mlp()
    data = batches(3, 5)
    step, _ = run(model, data, k=2)
    stats = step.stats.summary()
    assert step.stats.micro_batches == 3 and step.stats.samples == 15 and step.stats.updates == 2
    assert math.isfinite(stats["train_loss"]) and stats["grad_norm"] > 0


def test_fp16_skipped_update_is_counted_and_left_out_of_grad_norm():
    """An update whose fp16 gradients overflow is skipped by the GradScaler: it is counted, the
    weights do not move, and its inf norm does not reach the epoch's mean grad_norm."""
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    calls = {"n": 0}

    def overflow_first_window(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] <= 2 else grad  # micro-batches 1-2: window 1

    model[1].weight.register_hook(overflow_first_window)
    data = batches(4, 8)
    before = copy.deepcopy(model[1].weight.detach())
    outputs = []
    step = E.UpdateStep(model, torch.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(),
                        CPU, accumulation_steps=2, amp_dtype=torch.float16, scaler=scaler)
    trainer = E.create_trainer(step)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output))
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2),
                              lambda e: outputs.append(model[1].weight.detach().clone()))
    trainer.run(data, max_epochs=1)
    assert torch.equal(outputs[2], before)  # window 1 was skipped: the weights did not move
    assert not math.isfinite(float(outputs[1]["grad_norm"]))  # window 1's norm, as reported
    stats = step.stats.summary()
    assert stats["skipped_updates"] == 1 and step.stats.updates == 2  # windows: 1 skipped
    assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    assert stats["grad_norm"] == pytest.approx(float(outputs[-1]["grad_norm"]))  # window 2 only
    assert scaler.get_scale() == 2.0**9  # the scaler backed off once


def test_the_batchnorm_bias_multiplier_reaches_the_optimizer_and_the_update():
    """train.bn_bias_lr_scale: the BatchNorm biases, and only they, step at lr x scale, with no
    weight decay; the schedule keeps the ratio; every other parameter steps as before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                          nn.Linear(4 * 2 * 2, 3))
    bn = model[1]
    t = TrainConfig(optimizer="sgd", momentum=0.0, lr=0.1, weight_decay=0.05,
                    bn_bias_lr_scale=64.0)
    optimizer = E.build_optimizer(model, t)
    [bn_group] = [g for g in optimizer.param_groups if any(p is bn.bias for p in g["params"])]
    assert bn_group["params"] == [bn.bias]
    assert bn_group["lr"] == pytest.approx(6.4) and bn_group["weight_decay"] == 0.0
    others = [p for g in optimizer.param_groups if g is not bn_group for p in g["params"]]
    assert sorted(map(id, others + [bn.bias])) == sorted(map(id, model.parameters()))
    assert {g["lr"] for g in optimizer.param_groups if g is not bn_group} == {0.1}

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model(torch.randn(4, 2, 4, 4)).square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    after = dict(model.named_parameters())
    assert torch.allclose(after["1.bias"], before["1.bias"] - 6.4 * grads["1.bias"])
    assert torch.allclose(after["1.weight"], before["1.weight"] - 0.1 * grads["1.weight"])
    decayed = before["0.weight"] - 0.1 * (grads["0.weight"] + 0.05 * before["0.weight"])
    assert torch.allclose(after["0.weight"], decayed)

    scheduler = E.build_scheduler(optimizer, TrainConfig(epochs=2, scheduler="linear"), 4)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert bn_group["lr"] / optimizer.param_groups[0]["lr"] == pytest.approx(64.0)
    plain = E.build_optimizer(model, TrainConfig(optimizer="sgd", lr=0.1))
    assert {g["lr"] for g in plain.param_groups} == {0.1}


def test_the_moving_average_follows_each_update_not_each_micro_batch():
    """train.ema_decay: after every optimizer update (a window of 2 micro-batches here), the
    average moves to decay x itself + (1 - decay) x the new weights (the first update copies
    them); BatchNorm's running statistics are averaged alike."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    averaged = E.moving_average(model, 0.75)
    after_each: list[dict[str, torch.Tensor]] = []

    def after_update(skipped):
        averaged.update_parameters(model, skipped)
        after_each.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    step = E.UpdateStep(model, torch.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(),
                        torch.device("cpu"), accumulation_steps=2, after_update=after_update)
    trainer = E.create_trainer(step)
    batches = [(torch.randn(8, 3), torch.randint(0, 2, (8,))) for _ in range(4)]
    trainer.run(batches, max_epochs=1)
    assert len(after_each) == 2 and int(averaged.n_averaged) == 2
    final = model.state_dict()  # the last update's weights: it averaged after the step
    assert all(torch.equal(after_each[-1][k], v) for k, v in final.items())
    for key, value in averaged.module.state_dict().items():
        first, second = after_each[0][key], after_each[1][key]
        if key.endswith("num_batches_tracked"):
            continue
        expected = 0.75 * first + 0.25 * second
        assert torch.allclose(value, expected, atol=1e-6), key
    moved = [k for k in after_each[0] if not torch.equal(after_each[0][k], after_each[1][k])]
    assert {"0.weight", "2.weight", "1.running_mean"} <= set(moved)  # the average saw updates


@pytest.mark.parametrize("fused", [True, False])
def test_an_update_the_fp16_scaler_skips_moves_no_weight_no_state_and_no_average(fused):
    """torch's CPU GradScaler and an inf in the batch: the update is skipped on the device (a
    fused optimizer, as accel builds it for fp16; any other: torch's GradScaler on the host).
    The weights, the optimizer's momentum and the moving average stay where they were, the
    skip is counted and its norm left out; the schedule and the update count take the step
    (a step attempted, as the budget's clock counts it). The next clean update moves them all.
    The scale is halved, on the device."""
    model = mlp()
    t = TrainConfig(optimizer="sgd", lr=0.5, momentum=0.9)
    optimizer = E.build_optimizer(model, t, fused=fused)
    assert getattr(optimizer, "_step_supports_amp_scaling", False) is fused
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1 / (1 + u))
    averaged = E.moving_average(model, 0.5)
    averaged.update_parameters(model)  # started: the next updates are averaged
    told = []

    def after_update(skipped):
        told.append(float(skipped))
        averaged.update_parameters(model, skipped)

    step = E.UpdateStep(model, optimizer, nn.CrossEntropyLoss(), CPU, amp_dtype=torch.float16,
                        scaler=E.build_scaler(torch.float16, CPU), scheduler=scheduler,
                        after_update=after_update)
    engine = type("E", (), {})()
    engine.state = type("S", (), {"iteration": 1, "epoch_length": 10})()
    (x, y), = batches(1, 8)
    step(engine, (x, y))  # a clean update first: momentum buffers exist
    weights = [p.detach().clone() for p in model.parameters()]
    momenta = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    average = {k: v.clone() for k, v in averaged.state_dict().items()}
    bad = x.clone()
    bad[0, 0] = math.inf
    engine.state.iteration = 2
    out = step(engine, (bad, y))
    assert told == [0.0, 1.0]
    assert all(torch.equal(a, p) for a, p in zip(weights, model.parameters(), strict=True))
    assert all(torch.equal(m, optimizer.state[p]["momentum_buffer"])
               for m, p in zip(momenta, model.parameters(), strict=True))
    assert all(torch.equal(v, averaged.state_dict()[k]) for k, v in average.items()
               if k != "n_averaged")
    assert out["loss_scale"].item() == 2.0**15  # 2^16 halved, kept as a tensor
    assert step.updates == 2 and scheduler.last_epoch == 2  # the step attempted is counted
    stats = step.stats.summary()
    assert stats["skipped_updates"] == 1.0
    assert stats["grad_norm"] == pytest.approx(float(step.stats.grad_norm_sum))  # 1 applied
    engine.state.iteration = 3
    step(engine, (x, y))
    assert told == [0.0, 1.0, 0.0] and step.updates == 3
    assert not any(torch.equal(a, p) for a, p in zip(weights, model.parameters(), strict=True))
    assert not torch.equal(average["module.1.weight"], averaged.state_dict()["module.1.weight"])


def test_accel_nets_have_no_module_without_a_deterministic_cuda_backward():
    """train.deterministic=true raises on CUDA at the backward of such a module (torch's
    list: adaptive max pooling, fractional max pooling, 3-D max pooling, reflection and
    replication padding, EmbeddingBag); accel's own nets use none."""
    from accel.config import load
    from accel.models import build_model

    unsafe = (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.MaxPool3d,
              nn.FractionalMaxPool2d, nn.FractionalMaxPool3d, nn.ReflectionPad1d,
              nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
              nn.ReplicationPad3d, nn.EmbeddingBag)
    for name in ("accel_cnn_s", "accel_cnn_m"):
        cfg = load(None, [f"model.name={name}", "train.deterministic=true"])
        model = build_model(cfg, 10, 3, 32)
        found = [type(m).__name__ for m in model.modules() if isinstance(m, unsafe)]
        assert found == [], (name, found)
        x = torch.randn(2, 3, 32, 32, requires_grad=True)
        model(x).sum().backward()  # the global max pool differentiates
        assert x.grad is not None and torch.isfinite(x.grad).all()


def test_several_ranks_wrap_the_eager_model_then_compile_and_sync_bn_is_asked_for(monkeypatch):
    """train.nproc_per_node > 1 with train.compile: DistributedDataParallel goes around the
    eager module and the compile around it (not DDP around a compiled model, whose gradient
    all-reduce then cannot overlap the backward); train.sync_bn converts the BatchNorms first,
    sharing their parameters, and is refused on a CPU, where SyncBatchNorm does not run."""
    from accel import models, ranks
    from accel.config import ConfigError, load
    from accel.train import parts

    class Wrapped(nn.Module):  # stands in for DistributedDataParallel (no process group here)
        def __init__(self, module, device):
            super().__init__()
            self.module = module

    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(ranks, "wrap", lambda module, device: Wrapped(module, device))
    bare = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    cfg = load(None, ["train.compile=default"])
    trained = parts._trained(models.compile_model(bare, "default"), cfg, CPU)
    assert isinstance(trained, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(trained._orig_mod, Wrapped) and trained._orig_mod.module is bare
    with pytest.raises(ConfigError, match="train.sync_bn=true"):
        parts._trained(bare, load(None, ["train.sync_bn=true"]), CPU)
    weight = bare[1].weight
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(bare)
    assert isinstance(converted[1], nn.SyncBatchNorm) and converted[1].weight is weight
