"""Models: any timm model, sized to the data, with channels_last and torch.compile switches."""

from __future__ import annotations

import difflib

import torch

from accel import nets
from accel.config import Config, ConfigError


def check_model_name(name: str) -> None:
    """Exit-2 error for a name timm does not know, with the closest known names."""
    import timm

    nets.register()  # accel's own networks (accel_cnn_*)

    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    raise ConfigError(f"model.name={name!r} is not a timm model{hint}")


def build_model(cfg: Config, num_classes: int, in_chans: int, img_size: int) -> torch.nn.Module:
    """The bare model (no compile, on CPU): its `state_dict` is what checkpoints hold."""

    check_model_name(cfg.model.name)
    kwargs = dict(num_classes=num_classes, in_chans=in_chans)
    try:
        # ViT-family models build their patch grid from img_size; CNNs do not take it.
        model = _create(cfg, img_size=img_size, **kwargs)
    except TypeError:
        model = _create(cfg, **kwargs)
    if cfg.model.dirac_init:
        dirac_init(model)
    for norm in batch_norms(model):
        if cfg.model.bn_momentum is not None:
            norm.momentum = cfg.model.bn_momentum
        if cfg.train.bn_weight_frozen and norm.weight is not None:
            norm.weight.requires_grad_(False)  # stays at its init (1): no optimizer sees it
    return model


def batch_norms(model: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def dirac_init(model: torch.nn.Module) -> int:
    """airbench's partial Dirac init: each ungrouped convolution with an odd square kernel
    passes its first min(in, out) input channels straight through at the start (so a deep
    stack begins near the identity and trains faster); its other output channels keep their
    init. Returns how many convolutions it set."""
    done = 0
    for conv in model.modules():
        if not isinstance(conv, torch.nn.Conv2d):
            continue
        k = conv.kernel_size
        if conv.groups == 1 and k[0] == k[1] and k[0] % 2 == 1:
            with torch.no_grad():
                torch.nn.init.dirac_(conv.weight[: min(conv.in_channels, conv.out_channels)])
            done += 1
    return done


def _create(cfg: Config, **kwargs) -> torch.nn.Module:
    import timm

    try:
        return timm.create_model(cfg.model.name, pretrained=cfg.model.pretrained, **kwargs)
    except (OSError, RuntimeError, ValueError) as e:
        if not cfg.model.pretrained:
            raise
        raise ConfigError(
            f"model.pretrained=true: weights for {cfg.model.name!r} could not be fetched "
            f"({type(e).__name__}); use model.pretrained=false on a machine without network"
        ) from None


def prepare_model(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.nn.Module:
    """Move to the device and apply the memory-format and compile switches."""
    model = model.to(device)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cfg.train.compile:
        model = torch.compile(model)
    return model
