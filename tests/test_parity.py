"""The keys that set the fast recipe to airbench94's own arithmetic (checks/gpu/peer.py,
AIRBENCH_OVERRIDES): the Lookahead written back (train.lookahead_decay), weight decay on the
BatchNorm and whitening biases (train.bn_bias_decay), the whitening bias's own lr
(train.whiten_bias_lr_scale) and BatchNorm eps (model.bn_eps). Each is checked against airbench's
code (airbench==0.1.8: utils.LookaheadState, the optimizer groups of utils.train) or a hand
computation of it; their defaults leave every run as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from accel import config, engine
from accel.averaging import Lookahead
from accel.config import TrainConfig
from accel.models import batch_norms, build_model
from tests.conftest import ROOT

RECIPE = ROOT / "experiments" / "cifar10_fast.yaml"
# digits at 8 px through accel_cnn_s behind the whitening layer: a few seconds a run
WHITENED = ["data.dataset=digits", "model.name=accel_cnn_s", "model.img_size=8",
            "train.device=cpu", "train.amp=off", "data.num_workers=0", "model.whiten=2",
            "model.whiten_images=300", "train.batch_size=8", "train.epoch_length=4",
            "train.epochs=3", "train.optimizer=nesterov", "train.lr=0.05",
            "train.whiten_bias_epochs=1", "train.lookahead_decay=0.95",
            "tracking.system_metrics=false"]


# --- the Lookahead ----------------------------------------------------------------------------


class AirbenchLookahead:
    """airbench 0.1.8's utils.LookaheadState (its zip made strict)."""

    def __init__(self, net):
        self.net_ema = {k: v.clone() for k, v in net.state_dict().items()}

    def update(self, net, decay):
        for ema_param, net_param in zip(self.net_ema.values(), net.state_dict().values(),
                                        strict=True):
            if net_param.dtype in (torch.half, torch.float):
                ema_param.lerp_(net_param, 1 - decay)
                net_param.copy_(ema_param)


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def train_a_little(net: nn.Module, seed: int) -> None:
    """An optimizer's update stood in for: every weight moved, BatchNorm's statistics too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    net.train()
    net(torch.randn(8, 3, generator=g))  # running mean, variance and batch count move


@pytest.mark.parametrize("total", [12, 10])
def test_the_lookahead_is_airbench_update_by_update(total):
    """Against airbench's own LookaheadState stepped as its train() steps it, and against a hand
    computation: every 5th update u, average = d average + (1 - d) net with d = 0.95^5 (u/T)^3,
    then net = average (BatchNorm's running statistics too, not its batch count); after the
    last update (T) the net is the average: T=12 drops updates 11 and 12, T=10 ends on the
    write-back at 10."""
    ours_net, their_net = tiny_net(), tiny_net()
    lookahead = Lookahead(ours_net, 0.95, 5, lambda u: total)
    theirs = AirbenchLookahead(their_net)
    alpha = 0.95 ** 5 * (torch.arange(total + 1) / total) ** 3  # airbench's alpha_schedule
    hand = {k: v.double() for k, v in ours_net.state_dict().items() if v.is_floating_point()}
    for u in range(1, total + 1):
        train_a_little(ours_net, u)
        train_a_little(their_net, u)
        before = {k: v.clone() for k, v in ours_net.state_dict().items()}
        wrote = lookahead.after_update(u)
        if u % 5 == 0:
            theirs.update(their_net, decay=alpha[u].item())
        if u >= total:
            theirs.update(their_net, decay=1.0)
        assert wrote == (u % 5 == 0 or u == total), u
        d = 0.95 ** 5 * (u / total) ** 3 if u % 5 == 0 else 1.0 if u == total else None
        for name, value in before.items():
            if name in hand and d is not None:
                hand[name] = d * hand[name] + (1 - d) * value.double()
            expected = hand[name] if name in hand and d is not None else value
            got, airbench = ours_net.state_dict()[name], their_net.state_dict()[name]
            assert torch.allclose(got.double(), expected.double(), rtol=1e-6, atol=1e-7), (u, name)
            assert torch.allclose(got, airbench, rtol=1e-5, atol=1e-6), (u, name)
    assert int(ours_net[1].num_batches_tracked) == total  # counted, never averaged
    for name, value in lookahead.average.items():  # the net ends on the average
        assert torch.equal(ours_net.state_dict()[name], value), name
    if total == 12:  # updates 11 and 12 dropped: the net is the average written at 10
        assert torch.allclose(ours_net[0].weight.double(), hand["0.weight"], rtol=1e-6)


def test_the_lookahead_follows_the_plan_the_schedule_follows():
    """A budgeted run's plan, revised from 20 updates to 9 at update 7: the decay's T is the
    plan as it stands after each update, and the plan's last update (9, not a 5th) takes the
    average (decay 1)."""
    from accel.schedule import Schedule

    schedule = Schedule(TrainConfig(epochs=5, budget_s=60), 4, revisions=[[0, 20], [7, 9]])
    lookahead = Lookahead(tiny_net(), 0.95, 5, schedule.total_at)
    assert lookahead.decay_at(5) == pytest.approx(0.95 ** 5 * (5 / 20) ** 3)
    assert [lookahead.decay_at(u) for u in (1, 4, 6, 7, 8)] == [None] * 5
    assert lookahead.decay_at(9) == 1.0
    schedule.revise(9, 10)  # lengthened again: update 10 is a 5th and the last
    assert lookahead.decay_at(9) is None
    assert lookahead.decay_at(10) == pytest.approx(0.95 ** 5)


def test_a_run_ends_on_the_lookahead_and_its_held_bias_takes_the_average():
    """Through the run's own handlers, 3 epochs of 4 updates (T=12), the whitening bias held
    after epoch 1: the run scores the net; the net ends on the average; the held bias is what
    the write-back after update 5 gave it, d5 B0 + (1 - d5) B4 (B0 at the start, B4 where the
    hold began), and stays there, as airbench's frozen bias does."""
    from ignite.engine import Events

    from accel.train.parts import build

    run = build(config.load(None, WHITENED))
    bias = run.bare.whiten.bias
    seen = [bias.detach().clone()]
    run.trainer.add_event_handler(Events.EPOCH_COMPLETED,
                                  lambda _: seen.append(bias.detach().clone()))
    run.attach()
    run.trainer.run(run.batches, max_epochs=3, epoch_length=4)
    run.data.close()
    b0, b4, b8, b12 = seen
    d5 = 0.95 ** 5 * (5 / 12) ** 3
    assert torch.allclose(b8, d5 * b0 + (1 - d5) * b4, rtol=1e-5, atol=1e-7)
    assert not torch.equal(b8, b4) and torch.equal(b8, b12)
    assert run.scored is run.bare and run.averaged is None
    state = run.bare.state_dict()
    for name, value in run.lookahead.average.items():
        assert torch.equal(state[name], value), name


def test_a_checkpoint_carries_the_lookahead_on(tmp_path, monkeypatch):
    """Stopped after epoch 2 (its average written back at update 5, not the start's) and
    resumed in-process from the checkpoint file: epoch 3 ends bitwise as in the run never
    stopped, the net and the average alike. A checkpoint without the average is refused."""
    import accel.train as training
    from accel.train import checkpoint, parts
    from accel.train.run_log import RunLog

    states: list[dict] = []

    def last_state(_log, run) -> None:  # the checkpoint as `accel resume` would read it
        path = tmp_path / f"epoch-{run.trainer.state.epoch}.pt"
        checkpoint.save(checkpoint.capture(run), path)
        states.append(checkpoint.load(path))

    monkeypatch.setattr(RunLog, "last_state", last_state)
    cfg = config.load(None, WHITENED)
    training.train(cfg, track=False)
    reference, stopped = states[2], states[1]
    assert not torch.equal(stopped["lookahead"]["average"]["net.head.weight"],
                           states[0]["lookahead"]["average"]["net.head.weight"])
    states.clear()
    training.train(config.load(None, WHITENED), track=False,
                   resume=checkpoint.Resume(stopped, "stopped", same_run=True))
    [resumed] = states
    for part in ("model", "lookahead"):
        ours = resumed[part] if part == "model" else resumed[part]["average"]
        theirs = reference[part] if part == "model" else reference[part]["average"]
        for name, value in theirs.items():
            assert torch.equal(ours[name], value), (part, name)
    fresh = parts.build(cfg)
    with pytest.raises(checkpoint.CheckpointMismatch, match="Lookahead"):
        checkpoint.restore(fresh, {**stopped, "lookahead": None})
    fresh.data.close()


# --- the optimizer's groups -------------------------------------------------------------------


def whitened_model(*overrides: str) -> tuple[nn.Module, config.Config]:
    cfg = config.load(None, ["model.name=accel_cnn_s", "model.whiten=2",
                             "train.bn_weight_frozen=true", *overrides])
    torch.manual_seed(0)
    return build_model(cfg, 10, 3, 8), cfg


def group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict:
    [group] = [g for g in optimizer.param_groups if any(p is param for p in g["params"])]
    return group


def test_decayed_biases_lose_per_update_what_the_weights_lose():
    """train.bn_bias_decay: with no gradient, one Nesterov step shrinks every weight, BatchNorm
    bias and whitening bias by the same factor, by hand 1 - lr wd (1 + momentum) (the first
    step's buffer is the decay term itself), though the biases train at 64x and 1x the lr."""
    lr, wd, m = 0.3, 0.01, 0.85
    model, _ = whitened_model()
    t = TrainConfig(optimizer="nesterov", lr=lr, weight_decay=wd, momentum=m,
                    bn_bias_lr_scale=64, whiten_bias_lr_scale=1, bn_bias_decay=True)
    optimizer = engine.build_optimizer(model, t)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(2.0)
    trained = [p for p in model.parameters() if p.requires_grad]
    for p in trained:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    shrink = 1 - lr * wd * (1 + m)
    for p in trained:
        assert torch.allclose(p, torch.full_like(p, 2.0 * shrink), rtol=1e-6), p.shape
    bn, whitening = batch_norms(model)[0].bias, model.whiten.bias
    assert group_of(optimizer, bn)["lr"] == 64 * lr
    assert group_of(optimizer, bn)["weight_decay"] == pytest.approx(wd / 64)
    assert group_of(optimizer, whitening)["lr"] == lr
    assert group_of(optimizer, whitening)["weight_decay"] == pytest.approx(wd)


def test_three_updates_are_airbenchs_own_optimizer():
    """airbench's groups (utils.train: loss summed over the batch, lr and decay per 1024 images
    over its kilostep scale; BatchNorm biases at 64 lr with weight_decay wd / lr_biases, every
    other trained parameter, the whitening bias among them, at lr with wd / lr) against
    accel's at lr x batch (the loss averaged) with bn_bias_decay and whiten_bias_lr_scale=1:
    three updates on one model end on the same weights. Without the bias decay they do not."""
    batch, m = 16, 0.85
    kilostep = 1024 * (1 + 1 / (1 - m))
    lr, wd = 11.5 / kilostep, 5.0 * batch / kilostep  # a strong decay: easy to see
    model, _ = whitened_model()
    norm_biases = [n.bias for n in batch_norms(model)]
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def airbench() -> nn.Module:
        net = copy.deepcopy(model)
        norms = {id(n.bias) for n in batch_norms(net)}
        biases = [p for p in net.parameters() if id(p) in norms]
        other = [p for p in net.parameters() if p.requires_grad and id(p) not in norms]
        optimizer = torch.optim.SGD([dict(params=biases, lr=lr * 64, weight_decay=wd / (lr * 64)),
                                     dict(params=other, lr=lr, weight_decay=wd / lr)],
                                    momentum=m, nesterov=True)
        for _ in range(3):
            loss = nn.functional.cross_entropy(net(x), y, reduction="none").sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return net

    def accel(decay: bool) -> nn.Module:
        net = copy.deepcopy(model)
        t = TrainConfig(optimizer="nesterov", lr=lr * batch, momentum=m,
                        weight_decay=wd / (lr * batch), bn_bias_lr_scale=64,
                        whiten_bias_lr_scale=1, bn_bias_decay=decay)
        optimizer = engine.build_optimizer(net, t)
        for _ in range(3):
            loss = nn.functional.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return net

    theirs, ours, undecayed = airbench(), accel(True), accel(False)
    assert norm_biases and all(not torch.equal(b, torch.zeros_like(b)) for b in
                               (n.bias for n in batch_norms(theirs)))
    for (name, a), b in zip(theirs.named_parameters(), ours.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    off = [name for (name, a), b in zip(theirs.named_parameters(), undecayed.parameters(),
                                        strict=True) if not torch.allclose(a, b, rtol=1e-4,
                                                                           atol=1e-6)]
    assert "whiten.bias" in off and any("groups" in name for name in off)


def test_the_whitening_bias_takes_its_own_lr_or_the_batchnorm_biases():
    """train.whiten_bias_lr_scale=1: the whitening bias alone in a group at the lr; null: with
    the BatchNorm biases at lr x bn_bias_lr_scale, as before; no decay on either by default."""
    model, _ = whitened_model()
    t = TrainConfig(optimizer="nesterov", lr=0.2, bn_bias_lr_scale=64, whiten_bias_lr_scale=1)
    own = group_of(engine.build_optimizer(model, t), model.whiten.bias)
    assert [p is model.whiten.bias for p in own["params"]] == [True]
    assert (own["lr"], own["weight_decay"]) == (0.2, 0.0)
    t.whiten_bias_lr_scale = None
    shared = group_of(engine.build_optimizer(model, t), model.whiten.bias)
    assert shared["lr"] == pytest.approx(0.2 * 64) and shared["weight_decay"] == 0.0
    assert len(shared["params"]) == 1 + len(batch_norms(model))


def old_param_groups(model: nn.Module, t: TrainConfig) -> list[dict]:
    """accel.engine._param_groups as it was before these keys (the reference for defaults)."""
    from timm.optim import param_groups_weight_decay

    from accel.models import whitening_layer

    whitening = whitening_layer(getattr(model, "_orig_mod", model))
    biases = [m.bias for m in batch_norms(model)] + ([whitening.bias] if whitening else [])
    bn_biases = {id(b) for b in biases if b is not None and b.requires_grad}
    groups = []
    for group in param_groups_weight_decay(model, t.weight_decay):
        rest = [p for p in group["params"] if id(p) not in bn_biases]
        groups.append({**group, "params": rest})
    bn = [p for p in model.parameters() if id(p) in bn_biases]
    groups.append({"params": bn, "weight_decay": 0.0, "lr": t.lr * t.bn_bias_lr_scale})
    return [g for g in groups if g["params"]]


def old_optimizer(model: nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """accel.engine.build_optimizer as it was (muon aside): timm's factory on the model, or on
    the groups above where the BatchNorm biases have their own lr."""
    from timm.optim import create_optimizer_v2

    kwargs = {"momentum": t.momentum} if t.optimizer in ("sgd", "nesterov") else {}
    return create_optimizer_v2(model if t.bn_bias_lr_scale == 1 else old_param_groups(model, t),
                               opt=engine.OPTIMIZER_NAMES[t.optimizer], lr=t.lr,
                               weight_decay=t.weight_decay, **kwargs)


def described(groups: list[dict]) -> list[dict]:
    return [{**{k: v for k, v in g.items() if k != "params"},
             "params": [id(p) for p in g["params"]]} for g in groups]


@pytest.mark.parametrize("source", [RECIPE, None])
def test_the_defaults_build_the_optimizer_and_model_as_before(source):
    """The fast recipe and the quickstart without the new keys: the same param groups (ids,
    lr, weight decay), every BatchNorm at PyTorch's eps, no Lookahead."""
    cfg = config.load(source, [])
    t, m = cfg.train, cfg.model
    assert (t.bn_bias_decay, t.whiten_bias_lr_scale, t.lookahead_decay, m.bn_eps) == (
        False, None, None, None)
    side = 32 if source else 8
    model = build_model(cfg, 10, 3, side)
    assert {n.eps for n in batch_norms(model)} == {1e-5}
    built = engine.build_optimizer(model, t).param_groups
    assert described(built) == described(old_optimizer(model, t).param_groups)


@pytest.mark.parametrize("name", ["accel_cnn_s", "test_resnet"])
def test_every_batchnorm_takes_bn_eps(name):
    """model.bn_eps on accel's net and on a timm model: every BatchNorm layer's eps is it, and
    the normalisation uses it: channels of batch variance 1e-10 come out with a mean square of
    v / (v + eps), 0.99 at eps 1e-12 where PyTorch's 1e-5 would give 1e-5."""
    cfg = config.load(None, [f"model.name={name}", "model.bn_eps=1e-12"])
    model = build_model(cfg, 10, 3, 16)
    norms = batch_norms(model)
    assert norms and {n.eps for n in norms} == {1e-12}
    norm = norms[0].train()
    x = torch.randn(64, norm.num_features, 4, 4, generator=torch.Generator().manual_seed(0))
    out = norm(x * 1e-5) - norm.bias.detach().view(1, -1, 1, 1)
    assert out.pow(2).mean().item() == pytest.approx(1e-10 / (1e-10 + 1e-12), rel=1e-2)


# --- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("override, said", [
    ("model.bn_eps=0", "model.bn_eps=0.0: must be > 0 or null (the model's own)"),
    ("train.whiten_bias_lr_scale=-1",
     "train.whiten_bias_lr_scale=-1.0: must be > 0 or null (train.bn_bias_lr_scale)"),
    ("train.lookahead_decay=1", "train.lookahead_decay=1.0: must be in (0, 1), or null for off"),
    ("train.lookahead_every=0", "train.lookahead_every=0: must be >= 1"),
])
def test_bad_values_are_refused_in_one_line(override, said):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, [override])
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_the_lookahead_and_the_moving_average_are_one_or_the_other(capsys):
    """Through the CLI: exit 2, one line naming both values."""
    from accel.cli import main

    assert main(["train", "train.lookahead_decay=0.95", "train.ema_decay=0.98"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("accel: error: train.lookahead_decay=0.95 and train.ema_decay=0.98: "
                          "choose one") and "\n" not in err


def test_the_peers_overrides_are_airbenchs_arithmetic():
    """checks/gpu/peer.py's AIRBENCH_OVERRIDES load, and the optimizer they build on the
    recipe's network is airbench94's hyp: every trained parameter decays by 0.0153 x 1024 /
    kilostep of itself per update at the peak lr, the BatchNorm biases train at 64 x and
    the whitening bias at 1 x the lr; eps 1e-12; the Lookahead on, no moving average."""
    from checks.gpu.peer import accel_overrides

    cfg = config.load(RECIPE, accel_overrides())
    t = cfg.train
    assert (t.lookahead_decay, t.lookahead_every, t.ema_decay) == (0.95, 5, None)
    assert cfg.model.head_scale == 1 / 9 and cfg.model.bn_eps == 1e-12
    model = build_model(cfg, 10, 3, 32)
    assert {n.eps for n in batch_norms(model)} == {1e-12}
    kilostep = 1024 * (1 + 1 / (1 - 0.85))
    optimizer = engine.build_optimizer(model, t)
    for group in optimizer.param_groups:
        assert group["lr"] * group["weight_decay"] == pytest.approx(0.0153 * 1024 / kilostep,
                                                                    rel=1e-4)
    assert group_of(optimizer, model.whiten.bias)["lr"] == pytest.approx(11.5 * 1024 / kilostep,
                                                                         rel=1e-4)
    assert group_of(optimizer, batch_norms(model)[0].bias)["lr"] == pytest.approx(
        64 * 11.5 * 1024 / kilostep, rel=1e-4)


def test_the_whitening_bias_starts_at_zero_and_the_rest_of_the_init_is_unchanged():
    """model.whiten_bias_zero: the bias is zero and every other tensor is what the default
    init gives (the zeroing draws nothing from the random stream)."""
    built = {}
    for zero in (False, True):
        torch.manual_seed(0)
        cfg = config.load(RECIPE, [f"model.whiten_bias_zero={zero}"])
        built[zero] = build_model(cfg, 10, 3, 32).state_dict()
    assert built[False]["whiten.bias"].abs().max() > 0.05  # PyTorch's uniform init
    assert not built[True]["whiten.bias"].any()
    assert all(torch.equal(built[True][k], v) for k, v in built[False].items()
               if k != "whiten.bias")


def airbench_triangle(steps: int, start: float, end: float, peak: float) -> torch.Tensor:
    """airbench 0.1.8's utils.train triangle: the lr multiplier for step 0..steps."""
    xp = torch.tensor([0, int(peak * steps), steps])
    fp = torch.tensor([start, 1, end])
    x = torch.arange(1 + steps)
    m = (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])
    b = fp[:-1] - (m * xp[:-1])
    indices = torch.clamp(torch.sum(torch.ge(x[:, None], xp[None, :]), 1) - 1, 0, len(m) - 1)
    return m[indices] * x + b[indices]


@pytest.mark.parametrize("epochs", [1, 4, 10])
def test_the_peers_schedule_is_airbenchs_triangle_at_any_length(epochs):
    """At `epochs` whole epochs of airbench's 48 updates (50,000 images, batch 1024, the last
    short batch dropped) accel at the peer's overrides follows airbench's triangle laid over the
    same updates: the peak at the same update or one before (accel's warm-up counts the update
    it schedules), every multiplier within one warm-up step of airbench's, and the same end."""
    from accel.schedule import Schedule
    from checks.gpu.peer import accel_overrides

    t = config.load(RECIPE, accel_overrides(epochs)).train
    total = 48 * epochs
    theirs = airbench_triangle(total, 0.2, 0.07, 0.23)[:total]
    ours = torch.tensor([Schedule(t, 48)(u) for u in range(total)])
    step = 0.8 / int(0.23 * total)
    assert 0 <= int(theirs.argmax()) - int(ours.argmax()) <= 1
    assert (ours - theirs).abs().max() <= step + 1e-6
    assert ours[-1] == pytest.approx(float(theirs[-1]), abs=1e-6)


def test_the_peer_comparison_prints_each_seed_and_the_paired_intervals(capsys):
    """checks.gpu.peer_airbench's tables: a row per seed with accel - airbench94, and with
    --muon Muon - parity, each mean with its paired Student-t interval over the seeds (t at 2
    degrees of freedom, 4.303, times the differences' standard error)."""
    import argparse

    from checks.gpu import peer_airbench

    rows = [{"seed": s, "air": {"test_acc": a, "seconds": 10.0},
             "accel": {"test_acc": b, "seconds": 5.0}, "muon": {"test_acc": m, "seconds": 6.0}}
            for s, (a, b, m) in enumerate([(0.87, 0.86, 0.88), (0.88, 0.88, 0.89),
                                           (0.86, 0.87, 0.90)])]
    peer_airbench.report(rows, argparse.Namespace(airbench_epochs=4.0, epochs=4, amp="bf16"))
    out = capsys.readouterr().out
    assert "| 0 | 0.8700 | 0.8600 | -0.0100 | 10 | 5 |" in out
    assert "| 2 | 0.8700 | 0.9000 | +0.0300 | 5 | 6 |" in out
    # accel - airbench94: -0.01, 0, +0.01 -> mean 0, sd 0.01; Muon - parity: 0.02, 0.01, 0.03
    half = 4.302653 * 0.01 / 3 ** 0.5
    assert f"accel - airbench94: +0.0000 (paired 95% interval {-half:+.4f} .. {half:+.4f}, " \
           "3 seeds)" in out
    assert f"Muon - parity: +0.0200 (paired 95% interval {0.02 - half:+.4f} .. " \
           f"{0.02 + half:+.4f}, 3 seeds)" in out


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_airbench_on_the_cpu_sees_each_update_in_its_next_forward(amp):
    """checks.gpu.peer runs airbench's whole training loop inside one context; in bf16 that is
    one autocast region, whose cache of the weights' bf16 copies would feed every forward the
    weights of the first one (the one 4-epoch bf16 run so made scored 19.7%). An update
    between two forwards, as the optimizer makes it, must change the second's output."""
    from types import SimpleNamespace

    from checks.gpu import peer

    stand_in = SimpleNamespace(utils=SimpleNamespace(CifarLoader=None, init_whitening_conv=None))
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with peer._cpu(stand_in, amp):
        before = layer(x).float()
        with torch.no_grad():
            layer.weight.mul_(2.0)
        after = layer(x).float()
    assert (after - before).abs().max() > 0.1
