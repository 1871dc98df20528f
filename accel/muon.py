"""Muon for `train.optimizer=muon`: the network body's convolution filters and other weight
matrices take orthogonalised momentum steps (Keller Jordan's Muon, as airbench94_muon trains
CIFAR-10), everything else (norms, biases, the classifier head) the optimizer `train.muon_rest`
names (airbench94_muon: Nesterov SGD), as one torch optimizer that the update step, the
schedule, GradScaler and checkpoints treat like any other.

What the installed libraries give, and why part of it is written here:
- timm's `zeropower_via_newtonschulz` (timm.optim.muon) orthogonalises: the matrix divided by
  its Frobenius norm, then quintic Newton-Schulz iterations with Jordan's coefficients, in the
  precision asked for. Used as is.
- timm's `Muon` optimizer around it always iterates in bf16, which a CPU without bf16
  instructions emulates, many times slower than fp32 (`bench/muon_step.py` measures both), and
  it lacks airbench94_muon's weight normalisation; its fallback for the other parameters is
  AdamW only. torch's `torch.optim.Muon` takes 2-D parameters only: it refuses a convolution
  filter. So the step (`Muon`, below) is airbench94_muon's own, a dozen lines, with the
  precision a setting (train.muon_ns_dtype), and the rest is any of torch's optimizers as
  timm's factory builds them (`MuonAndRest`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from accel.config import TrainConfig
from accel.config_checks import MUON_NS_DTYPES
from accel.errors import ConfigError

COEFFICIENTS = [(3.4445, -4.7750, 2.0315)]  # Jordan's quintic, every iteration (airbench94_muon)
NS_DTYPES = dict(zip(MUON_NS_DTYPES, (torch.bfloat16, torch.float32), strict=True))


class Muon(torch.optim.Optimizer):
    """airbench94_muon's Muon. For each weight W with gradient G, in this order:
        buf = momentum * buf + G                 (the momentum buffer, a sum)
        D   = G + momentum * buf                 (Nesterov)
        W   = W * sqrt(rows) / ||W||_F           (renorm: a mean squared filter norm of 1)
        W   = W - lr * NS(D as rows x (in * kh * kw)), back to W's shape
    where NS is `ns_steps` Newton-Schulz iterations in `ns_dtype` (timm's function). The
    renormalisation scales the whole tensor, as airbench94_muon does, not each filter apart,
    before the step, not after it: a convolution followed by BatchNorm computes the same
    function at any scale, so it only keeps the step's size relative to the weight fixed;
    where a weight's scale matters (a ViT's projections), set train.muon_renorm=false. No weight
    decay, as in airbench94_muon."""

    def __init__(self, params, *, lr: float, momentum: float, ns_steps: int,
                 renorm: bool = True, ns_dtype: str = "bf16"):
        super().__init__(params, dict(lr=lr, momentum=momentum, ns_steps=ns_steps,
                                      renorm=renorm, ns_dtype=ns_dtype))

    @torch.no_grad()
    def step(self, closure=None):
        from timm.optim.muon import zeropower_via_newtonschulz

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"].mul_(momentum).add_(p.grad)
                direction = p.grad.add(buf, alpha=momentum)
                if group["renorm"]:
                    p.mul_(len(p) ** 0.5 / p.norm().clamp(min=1e-12))
                update = zeropower_via_newtonschulz(direction.reshape(len(p), -1),
                                                    group["ns_steps"], COEFFICIENTS,
                                                    dtype=NS_DTYPES[group["ns_dtype"]])
                p.add_(update.reshape(p.shape), alpha=-lr)
        return loss


def classifier_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The classifier head's parameters: timm's `get_classifier()` of the network inside
    accel's wrappers (whitening, scaled logits, compile); for a model that is not timm's, its
    last `nn.Linear`."""
    net = next((m for m in model.modules() if hasattr(m, "get_classifier")), None)
    if net is not None:
        head = net.get_classifier()
        heads = head if isinstance(head, tuple | list) else (head,)
        return [p for h in heads if isinstance(h, torch.nn.Module) for p in h.parameters()]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return list(linears[-1].parameters()) if linears else []


def is_body_matrix(p: torch.nn.Parameter) -> bool:
    """Trained, two or more dimensions, more than one row: a filter bank or a weight matrix.
    A tensor of one row (a ViT's position embedding, its class token: 1 x N x D) is a set of
    vectors, not a map for Muon to orthogonalise."""
    return p.requires_grad and p.ndim >= 2 and p.shape[0] > 1


def split(model: torch.nn.Module, groups: list[dict]) -> tuple[list[torch.nn.Parameter],
                                                                list[dict]]:
    """(the body's matrices, for Muon; `groups`, the rest optimizer's parameter groups, without
    them). The head stays with the rest, as in airbench94_muon (and Jordan's advice: the input
    and output layers take a conventional optimizer)."""
    head = {id(p) for p in classifier_params(model)}
    body = [p for p in model.parameters() if is_body_matrix(p) and id(p) not in head]
    taken = {id(p) for p in body}
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in taken]} for g in groups]
    return body, [g for g in rest if g["params"]]


def build_muon(model: torch.nn.Module, groups: list[dict],
               make_rest: Callable[[list[dict]], torch.optim.Optimizer],
               t: TrainConfig) -> MuonAndRest:
    """`train.optimizer=muon`: `groups` (the parameter groups the rest optimizer would take for
    the whole model) split, the rest built by `make_rest`, the body given to Muon."""
    body, rest = split(model, groups)
    if not body:
        raise ConfigError("train.optimizer=muon: the model has no trained weight of two or more "
                          "dimensions besides its head; choose one of adam, adamw, sgd, nesterov")
    muon = Muon(body, lr=t.muon_lr, momentum=t.muon_momentum, ns_steps=t.muon_ns_steps,
                renorm=t.muon_renorm, ns_dtype=t.muon_ns_dtype)
    return MuonAndRest(muon, make_rest(rest))


class MuonAndRest(torch.optim.Optimizer):
    """Two optimizers as one: `rest` (one of torch's, over the norms, biases and head) and
    `muon` (over the body). Its param_groups are theirs, the rest's first, so group 0's lr is
    train.lr under the schedule (the logged `lr`) and a scheduler's writes reach both; its
    state is theirs (one dict), so `state_dict()` has torch's layout and a checkpoint resumes.

    Under fp16 the rest is built fused; this optimizer as a whole does not take GradScaler's
    inf check itself, so `scaler.step` reads it on the host once per update and skips the whole
    update (the renormalisation included) where it finds inf/NaN."""

    def __init__(self, muon: Muon, rest: torch.optim.Optimizer):
        self.muon, self.rest = muon, rest
        super().__init__([*rest.param_groups, *muon.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Point both optimizers at this one's groups and state (after a load replaced them)."""
        cut = len(self.rest.param_groups)
        self.rest.param_groups, self.muon.param_groups = \
            self.param_groups[:cut], self.param_groups[cut:]
        self.rest.state = self.muon.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.rest.step()
        return loss
