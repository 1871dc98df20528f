"""The optimizer's parameter groups: which parameters take which learning rate and weight
decay. timm's split (decay on weights, none on norms, biases and other vectors), and airbench's
groups for the BatchNorm biases and the whitening bias (train.bn_bias_lr_scale,
train.whiten_bias_lr_scale, train.bn_bias_decay)."""

from __future__ import annotations

import torch

from accel.config import TrainConfig


def param_groups(model: torch.nn.Module, t: TrainConfig) -> list[dict]:
    """timm's two groups (decay: weights of two or more dimensions; no decay: norms, biases and
    other vectors), with the BatchNorm biases (and a whitening layer's, model.whiten) moved to
    a third at lr x bn_bias_lr_scale, as airbench does; the whitening bias in a fourth at lr x
    whiten_bias_lr_scale where that is set. Their decay: `bias_decay`."""
    from timm.optim import param_groups_weight_decay

    from accel.models import batch_norms, whitening_layer

    whitening = whitening_layer(getattr(model, "_orig_mod", model))  # compiled: the module
    norm_biases = [m.bias for m in batch_norms(model)]
    moved = [(norm_biases, t.bn_bias_lr_scale)]  # (biases, lr scale): each a group of its own
    if whitening is not None and t.whiten_bias_lr_scale is not None:
        moved.append(([whitening.bias], t.whiten_bias_lr_scale))
    elif whitening is not None:
        norm_biases.append(whitening.bias)
    kept = [{id(b) for b in biases if b is not None and b.requires_grad} for biases, _ in moved]
    taken = set().union(*kept)
    groups = [{**group, "params": [p for p in group["params"] if id(p) not in taken]}
              for group in param_groups_weight_decay(model, t.weight_decay)]
    for ids, (_, scale) in zip(kept, moved, strict=True):
        groups.append({"params": [p for p in model.parameters() if id(p) in ids],
                       "weight_decay": bias_decay(t, scale), "lr": t.lr * scale})
    return [g for g in groups if g["params"]]


def bias_decay(t: TrainConfig, scale: float) -> float:
    """The weight_decay of a bias group at lr x `scale`: 0, or with train.bn_bias_decay what
    decays it per update as much as the weights.

    torch's SGD adds weight_decay x p to the gradient (the momentum carries it as it carries
    the gradient) and steps lr x that; AdamW steps lr x weight_decay x p itself. The schedule
    scales every group's lr alike and leaves weight_decay. So the weights, at train.lr, lose
    lr x weight_decay x p per update, and a group at lr x scale loses the same with
    weight_decay / scale: (lr x scale) x (weight_decay / scale) = lr x weight_decay. airbench's
    groups are so: its BatchNorm biases at lr_biases = 64 lr with weight_decay wd / lr_biases,
    its weights (the whitening bias among them) at lr with wd / lr, each parameter decayed by
    wd x p per update. (Adam divides its L2 term by the gradients' second moment: there the
    decays match only in lr x weight_decay.)"""
    return t.weight_decay / scale if t.bn_bias_decay else 0.0
