"""accel's own small, fast networks, registered with timm when this module is imported (as
timm's own modules register theirs): `model.name=accel_cnn_s` selects one like any timm model,
and `import accel.nets` is all `timm.create_model("accel_cnn_s")` needs outside accel.

The design is that of the fastest known CIFAR-10 trainings (Keller Jordan's airbench, after
David Page's ResNet-9): a stem convolution, then conv groups of conv -> max-pool -> BN -> GELU ->
conv -> BN -> GELU, a global max-pool and a bias-free linear head. Few, wide layers: on a small
CPU, per-layer overhead rather than arithmetic sets the pace of a deep ResNet at 8-32 px.
"""

from __future__ import annotations

import torch
from torch import nn

# name -> (stem width, conv group widths, ceil); one max-pool per group, which rounds an odd
# side up (ceil) or down: a whitened 7 px digit keeps a pixel to its last group only with ceil;
# a whitened 31 px CIFAR image goes 31 -> 15 -> 7 -> 3 with floor, as in airbench94
WIDTHS = {
    "accel_cnn_s": (24, (32, 64, 128), True),  # the quickstart's: digits at 8 px, ~0.2 M params
    "accel_cnn_m": (64, (64, 256, 256), False),  # CIFAR-10 at 32 px, ~2 M (airbench94's widths)
}


def conv_bn(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.GELU()]


class ConvGroup(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, ceil: bool = True):
        first, bn, act = conv_bn(c_in, c_out)
        super().__init__(first, nn.MaxPool2d(2, ceil_mode=ceil), bn, act, *conv_bn(c_out, c_out))


class GlobalMaxPool(nn.Module):
    """The maximum over each channel's pixels, [N, C, H, W] -> [N, C, 1, 1]: `amax`, whose
    backward is elementwise and deterministic on CUDA, where nn.AdaptiveMaxPool2d's is not
    (train.deterministic=true would raise on it). The same values forward; backward, a tie for
    the maximum shares the gradient instead of giving it to one pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(dim=(-2, -1), keepdim=True)


class AccelCNN(nn.Module):
    """`whitened=True`: the input is a whitening layer's output (accel.models.Whitened), which
    takes the stem convolution's place, as in airbench: the stem is only its GELU."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, stem: int = 24,
                 widths: tuple[int, ...] = (32, 64, 128), drop_rate: float = 0.0,
                 whitened: bool = False, ceil: bool = True):
        super().__init__()
        self.num_classes, self.num_features = num_classes, widths[-1]
        if whitened:
            self.stem, stem = nn.GELU(), in_chans
        else:
            self.stem = nn.Sequential(*conv_bn(in_chans, stem))
        self.groups = nn.Sequential(*(ConvGroup(a, b, ceil)
                                      for a, b in zip((stem, *widths), widths, strict=False)))
        self.pool = GlobalMaxPool()
        self.drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(widths[-1], num_classes, bias=False)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.groups(self.stem(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(self.pool(x).flatten(1))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes, bias=False)


def _entrypoint(name: str):
    stem, widths, ceil = WIDTHS[name]

    def create(pretrained: bool = False, *, pretrained_cfg=None, pretrained_cfg_overlay=None,
               cache_dir=None, **kwargs) -> AccelCNN:
        if pretrained:
            raise ValueError(f"{name} has no pretrained weights")
        # img_size: a TypeError, as for timm's CNNs
        return AccelCNN(stem=stem, widths=widths, ceil=ceil, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    return create


def register() -> None:
    """Make the networks known to timm (once per process; importing this module calls it)."""
    import timm
    from timm.models import register_model

    for name in WIDTHS:
        if not timm.is_model(name):
            register_model(_entrypoint(name))


register()
