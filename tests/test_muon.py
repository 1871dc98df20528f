"""train.optimizer=muon (accel.muon): the step against airbench94_muon's arithmetic done by hand
in float64 (Newton-Schulz, Nesterov momentum, the weight renormalisation), which parameters
take Muon and which the rest, a checkpoint that resumes, fp16's skipped update, the config's
checks, the tuner's space, and the quickstart through the CLI. Each hand check also shows that
the wrong arithmetic (more iterations, no Nesterov, no renormalisation) lands outside its
tolerance, so a test passes for the right reason."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch
from torch import nn

from accel import config, engine, models
from accel.config import ConfigError, TrainConfig
from accel.muon import Muon, MuonAndRest
from tests.conftest import ROOT, run_in_process

A, B, C = 3.4445, -4.7750, 2.0315  # airbench94_muon's coefficients
TOLERANCE = {"fp32": 1e-4, "bf16": 0.15}  # Frobenius distance to float64, one update
LOWEST = 0.003
MUON_RECIPE = ROOT / "experiments" / "cifar10_fast_muon.yaml"


def newton_schulz(g: torch.Tensor, steps: int = 3) -> torch.Tensor:
    """airbench94_muon's zeropower_via_newtonschulz5, in float64, on g flattened to rows."""
    x = g.reshape(len(g), -1).double()
    x = x / (x.norm() + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B * a + C * a @ a) @ x
    return (x.T if tall else x).reshape(g.shape)


def spread_spectrum(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A gradient whose flattened matrix has singular values 1 down to LOWEST: three iterations
    leave the small ones far from where two or four would, so a wrong count shows."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape[0], math.prod(shape[1:])
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    s = torch.logspace(0, math.log10(LOWEST), k, dtype=torch.float64)
    return (u * s @ v.T).float().reshape(shape)


def one_weight(shape, *, seed: int = 0, **muon) -> tuple[nn.Parameter, Muon]:
    gen = torch.Generator().manual_seed(seed)
    w = nn.Parameter(torch.randn(shape, generator=gen))
    settings = dict(lr=1.0, momentum=0.6, ns_steps=3, renorm=False, ns_dtype="fp32") | muon
    return w, Muon([w], **settings)


@pytest.mark.parametrize("ns_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(6, 2, 3, 3), (8, 3)], ids=["conv-filters", "tall-matrix"])
def test_the_first_step_is_the_gradients_newton_schulz_orthogonalisation(shape, ns_dtype):
    """Step 1: the buffer is G, the Nesterov direction (1 + momentum) G, Newton-Schulz divides
    the scale out: W1 = W0 - lr * NS3(G), G flattened to out x (in * kh * kw) (a conv) or
    transposed while it is tall, and back to W's shape."""
    w, opt = one_weight(shape, lr=0.5, ns_dtype=ns_dtype)
    g = spread_spectrum(shape)
    w0 = w.detach().double().clone()
    w.grad = g.clone()
    opt.step()
    update = (w0 - w.detach().double()) / 0.5
    want = newton_schulz(g)
    tol = TOLERANCE[ns_dtype]
    assert (update - want).norm() < tol
    for wrong in (newton_schulz(g, steps=2), newton_schulz(g, steps=4)):
        assert (wrong - want).norm() > 3 * tol
    # what three iterations make of singular values 1 .. 0.003: near 1 above, short below
    singular = torch.linalg.svdvals(want.reshape(len(g), -1))
    assert singular.max() < 1.2 and singular.min() < 0.5


def test_momentum_is_an_airbench_sum_with_a_nesterov_look_ahead():
    """Three steps with G1, G2, G3: buf_t = m buf_(t-1) + G_t, D_t = G_t + m buf_t,
    W_t = W_(t-1) - lr NS3(D_t). Heavy-ball momentum (D_t = buf_t) or none (D_t = G_t) miss."""
    m, lr = 0.6, 0.1
    w, opt = one_weight((5, 7), lr=lr, momentum=m)
    grads = [torch.randn(5, 7, generator=torch.Generator().manual_seed(i)) for i in (1, 2, 3)]
    nesterov, heavy_ball, plain = (w.detach().double().clone() for _ in range(3))
    buf = torch.zeros(5, 7, dtype=torch.float64)
    for g in grads:
        w.grad = g.clone()
        opt.step()
        buf = m * buf + g.double()
        nesterov -= lr * newton_schulz(g.double() + m * buf)
        heavy_ball -= lr * newton_schulz(buf)
        plain -= lr * newton_schulz(g.double())
    assert torch.allclose(w.detach().double(), nesterov, atol=1e-4, rtol=0)
    assert torch.allclose(opt.state[w]["momentum_buffer"].double(), buf, atol=1e-5, rtol=0)
    for wrong in (heavy_ball, plain):
        assert (wrong - nesterov).abs().max() > 1e-2


def test_renorm_scales_the_weight_to_norm_sqrt_rows_before_the_step():
    """airbench94_muon: W * sqrt(out channels) / ||W||_F (the whole tensor), then the step."""
    shape = (4, 3, 3, 3)
    w, opt = one_weight(shape, lr=0.05, renorm=True)
    with torch.no_grad():
        w.mul_(7.0)  # far from norm 2
    g = spread_spectrum(shape, seed=1)
    w0 = w.detach().double().clone()
    w.grad = g.clone()
    opt.step()
    want = w0 * 2.0 / w0.norm() - 0.05 * newton_schulz(g)
    assert torch.allclose(w.detach().double(), want, atol=1e-5, rtol=0)
    per_filter = w0 / w0.flatten(1).norm(dim=1).view(-1, 1, 1, 1) - 0.05 * newton_schulz(g)
    unscaled = w0 - 0.05 * newton_schulz(g)
    for wrong in (per_filter, unscaled):
        assert (wrong - want).abs().max() > 1e-2


def fast_recipe_model() -> tuple[nn.Module, TrainConfig]:
    cfg = config.load(MUON_RECIPE)
    return models.build_model(cfg, num_classes=10, in_chans=3, img_size=32), cfg.train


def groups_of(optimizer: MuonAndRest, model: nn.Module) -> tuple[set[str], list[set[str]]]:
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]}
    rest = [{names[id(p)] for p in g["params"]} for g in optimizer.rest.param_groups]
    return muon, rest


def test_the_fast_recipe_splits_as_airbench94_muon():
    """Muon: the six 3x3 filter banks. Nesterov SGD: the head, the BatchNorm biases and the
    whitening bias (at 64x the lr, no decay). Frozen: the whitening filters and the BatchNorm
    weights, in no group. Every trained parameter in exactly one group."""
    model, t = fast_recipe_model()
    optimizer = engine.build_optimizer(model, t)
    muon, rest = groups_of(optimizer, model)
    params = dict(model.named_parameters())
    assert muon == {n for n, p in params.items() if p.ndim == 4 and p.requires_grad}
    assert len(muon) == 6 and "whiten.weight" not in muon
    head = "net.net.head.weight"
    assert head in set().union(*rest) and head not in muon
    biases = {n for n in params if n.endswith(".bias")}
    assert biases <= set().union(*rest)
    listed = [*muon, *(n for g in rest for n in g)]
    assert sorted(listed) == sorted(n for n, p in params.items() if p.requires_grad)
    assert isinstance(optimizer.rest, torch.optim.SGD)
    assert all(g["nesterov"] and g["momentum"] == t.momentum
               for g in optimizer.rest.param_groups)
    by_lr = {g["lr"]: g for g in optimizer.rest.param_groups}
    assert set(by_lr) == {t.lr, t.lr * t.bn_bias_lr_scale}
    assert by_lr[t.lr * t.bn_bias_lr_scale]["weight_decay"] == 0.0
    assert optimizer.param_groups[0]["lr"] == t.lr  # the logged lr is train.lr's
    assert [g["lr"] for g in optimizer.muon.param_groups] == [t.muon_lr]


def test_a_vit_keeps_its_tokens_norms_and_head_out_of_muon():
    model = models.build_model(config.load(None, ["model.name=test_vit", "model.img_size=16"]),
                               num_classes=10, in_chans=3, img_size=16)
    muon, rest = groups_of(engine.build_optimizer(model, TrainConfig(optimizer="muon")), model)
    params = dict(model.named_parameters())
    assert {"patch_embed.proj.weight", "blocks.0.attn.qkv.weight"} <= muon
    assert all(params[n].ndim >= 2 for n in muon)
    assert {"pos_embed", "cls_token", "head.weight", "head.bias", "norm.weight"} <= \
        set().union(*rest)


def test_the_schedule_scales_muons_lr_as_it_scales_the_rest():
    model, t = fast_recipe_model()
    optimizer = engine.build_optimizer(model, t)
    scheduler = engine.build_scheduler(optimizer, t, epoch_length=10)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    multiplier = optimizer.param_groups[0]["lr"] / t.lr
    assert 0 < multiplier < 1
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(t.muon_lr * multiplier)


def mlp_like() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 8),
                         nn.GELU(), nn.Linear(8, 3))


def backward(model: nn.Module, seed: int, bad: bool = False, scaler=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    if bad:
        x[0, 0] = math.inf
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    (scaler.scale(loss) if scaler is not None else loss).backward()


def test_a_checkpoint_resumes_both_halves_exactly(tmp_path):
    """state_dict in torch's layout (saved, loaded with weights_only=True as accel's
    checkpoints are): a resumed optimizer's next step equals the uninterrupted one's."""
    t = TrainConfig(optimizer="muon", lr=0.1, muon_ns_dtype="fp32")
    a = mlp_like()
    opt_a = engine.build_optimizer(a, t)
    for seed in (1, 2):
        backward(a, seed)
        opt_a.step()
    torch.save({"model": a.state_dict(), "opt": opt_a.state_dict()}, tmp_path / "c.pt")
    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    b = mlp_like()
    b.load_state_dict(saved["model"])
    opt_b = engine.build_optimizer(b, t)
    opt_b.load_state_dict(saved["opt"])
    assert opt_b.rest.state is opt_b.state and opt_b.muon.param_groups[0] is \
        opt_b.param_groups[-1]
    for model, opt in ((a, opt_a), (b, opt_b)):
        backward(model, 3)
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    fresh = mlp_like()
    fresh.load_state_dict(saved["model"])
    opt_fresh = engine.build_optimizer(fresh, t)  # no state: the momentum is missing
    backward(fresh, 3)
    opt_fresh.step()
    assert not all(torch.equal(p, q)
                   for p, q in zip(a.parameters(), fresh.parameters(), strict=True))


def test_fp16_builds_the_rest_fused_and_skips_an_inf_update_whole():
    """fused=True (accel's fp16 path): the rest is torch's fused SGD; GradScaler reads the inf
    check on the host (Muon does not take it) and skips the whole update: no weight and no
    momentum moves, the renormalisation included. A clean update then moves them."""
    model = mlp_like()
    t = TrainConfig(optimizer="muon", muon_rest="nesterov", lr=0.1)
    optimizer = engine.build_optimizer(model, t, fused=True)
    assert all(g["fused"] for g in optimizer.rest.param_groups)
    scaler = engine.build_scaler(torch.float16, torch.device("cpu"))

    def update(bad: bool, seed: int) -> None:
        backward(model, seed, bad, scaler)
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()

    update(False, 1)
    weights = [p.detach().clone() for p in model.parameters()]
    momenta = {id(p): s["momentum_buffer"].clone() for p, s in optimizer.state.items()}
    update(True, 2)
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters(), strict=True))
    assert all(torch.equal(momenta[id(p)], s["momentum_buffer"])
               for p, s in optimizer.state.items())
    update(False, 3)
    assert all(not torch.equal(w, p) for w, p in zip(weights, model.parameters(), strict=True)
               if p.requires_grad)


@pytest.mark.parametrize(("override", "says"), [
    ("train.muon_rest=muon", "train.muon_rest='muon' is not one of: adam, adamw, sgd, nesterov"),
    ("train.muon_ns_dtype=fp16", "train.muon_ns_dtype='fp16' is not one of: bf16, fp32"),
    ("train.muon_momentum=1", "train.muon_momentum=1.0: must be in [0, 1)"),
    ("train.muon_lr=0", "train.muon_lr=0.0: must be > 0"),
    ("train.muon_ns_steps=0", "train.muon_ns_steps=0: must be >= 1"),
    ("train.optimizer=lion", "adam, adamw, sgd, nesterov, muon"),
])
def test_bad_muon_settings_exit_2_with_one_line(override, says):
    out = run_in_process("train", "train.optimizer=muon", override)
    assert out.returncode == 2
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_study_can_search_muon_and_its_settings():
    from accel.tune.space import parse_space

    cfg = config.load(None)
    cfg.search.space = {
        "train.optimizer": {"type": "categorical", "choices": ["adamw", "nesterov", "muon"]},
        "train.muon_lr": {"type": "float", "low": 0.05, "high": 0.5, "log": True,
                          "when": {"train.optimizer": "muon"}},
    }
    assert [d.key for d in parse_space(cfg)] == ["train.optimizer", "train.muon_lr"]
    cfg.search.space = {"train.muon_rest": {"type": "categorical", "choices": ["muon"]}}
    with pytest.raises(ConfigError, match="train.muon_rest"):
        parse_space(cfg)


def test_the_quickstart_trains_with_muon_through_the_cli(store):
    """`accel train train.optimizer=muon` on the quickstart (2 of its epochs; Newton-Schulz in
    fp32, which no CPU emulates; bf16's is checked by the step's own test above): a finished
    run that learned, logged with its Muon settings."""
    out = run_in_process("train", "train.optimizer=muon", "train.muon_ns_dtype=fp32",
                         "train.epochs=2", "train.device=cpu", "train.amp=off",
                         "tracking.system_metrics=false", "--tracking-uri", store)
    assert out.returncode == 0, out.stderr[-2000:]
    client = mlflow.MlflowClient(tracking_uri=store)
    run, = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["train.optimizer"], params["train.muon_lr"]) == ("muon", "0.24")
    assert run.data.metrics["val_accuracy"] > 0.5  # 10 classes: chance is 0.1
