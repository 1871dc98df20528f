"""What one training image costs in floating-point operations, counted once per run.

torch's `FlopCounterMode` counts the forward and backward pass of the real model on a copy of
it on the meta device (shapes only: no memory, no arithmetic, the model's weights and
statistics untouched). It counts matrix multiplies and convolutions, two FLOPs per
multiply-add; norms, activations, pooling, the loss and the optimizer are not counted
(docs/mlflow.md#speed), which for a convolutional network is well under 1% of the total.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

BATCH = 2  # BatchNorm in training mode needs more than one value per channel


@dataclass(frozen=True)
class Count:
    per_image: float  # forward and backward FLOPs of one training image
    heaviest_conv: tuple | None  # (in_channels, out_channels, kernel, stride, padding, groups,
    # input height, input width): the convolution the peak probe times, or None


_COUNTED: dict[tuple, Count] = {}  # this process's counts, by the network's structure


def count_training_flops(model: torch.nn.Module, image_shape: tuple[int, ...]) -> Count:
    """FLOPs of one image's forward and backward pass through `model` as it trains (its frozen
    parameters get no gradient), and its heaviest convolution. `image_shape`: (C, H, W).
    Counted once per process for a structure and input: a study's trials that train the same
    network in one worker share the count."""
    shape = tuple(image_shape)
    key = _structure(model, shape)
    if key not in _COUNTED:
        _COUNTED[key] = _count(model, shape)
    return _COUNTED[key]


def _structure(model: torch.nn.Module, image_shape: tuple[int, ...]) -> tuple:
    """What the count depends on: every module as its repr shows it (its type, shapes and
    settings), every parameter's shape and whether it trains, and the input's shape."""
    params = tuple((name, tuple(p.shape), p.requires_grad)
                   for name, p in model.named_parameters())
    return repr(model), params, image_shape


def _count(model: torch.nn.Module, image_shape: tuple[int, ...]) -> Count:
    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta").train()
    for module in meta.modules():  # the copy runs no hook of the model's (a user's, a spy's)
        for hooks in (module._forward_hooks, module._forward_pre_hooks,
                      module._backward_hooks, module._backward_pre_hooks):
            hooks.clear()
    convs: dict[str, tuple] = {}  # name: (forward FLOPs, shape)
    hooks = [m.register_forward_hook(_shape_of(name, convs))
             for name, m in meta.named_modules() if isinstance(m, torch.nn.Conv2d)]
    x = torch.empty((BATCH, *image_shape), device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        meta(x).float().sum().backward()
    for hook in hooks:
        hook.remove()
    heaviest = max(convs.values(), default=None, key=lambda conv: conv[0])
    return Count(counter.get_total_flops() / BATCH, heaviest[1] if heaviest else None)


def _shape_of(name: str, convs: dict[str, tuple]):
    """A hook that keeps a convolution's forward FLOPs and its shape."""
    def hook(module: torch.nn.Conv2d, inputs, output):
        h, w = inputs[0].shape[-2:]
        kh, kw = module.kernel_size
        forward = 2 * output.numel() * module.in_channels // module.groups * kh * kw
        convs[name] = (forward, (module.in_channels, module.out_channels, module.kernel_size,
                                 module.stride, module.padding, module.groups, int(h), int(w)))
    return hook
