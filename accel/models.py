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
    k, images_chans = cfg.model.whiten, in_chans
    if k:  # the network sees the whitening layer's channels, k - 1 pixels smaller
        in_chans, img_size = Whitened.width(in_chans, k), img_size - k + 1
    kwargs = dict(num_classes=num_classes, in_chans=in_chans)
    if k and cfg.model.name in nets.WIDTHS:  # accel's nets: the whitening is their stem conv
        kwargs["whitened"] = True
    try:
        # ViT-family models build their patch grid from img_size; CNNs do not take it.
        model = _create(cfg, img_size=img_size, **kwargs)
    except TypeError:
        model = _create(cfg, **kwargs)
    if cfg.model.dirac_init:
        dirac_init(model)
    if cfg.model.head_scale != 1:
        model = ScaledLogits(model, cfg.model.head_scale)
    if k:
        model = Whitened(model, images_chans, k)
        if cfg.model.whiten_bias_zero:  # after PyTorch's init: the random stream is the same
            torch.nn.init.zeros_(model.whiten.bias)
    for norm in batch_norms(model):
        if cfg.model.bn_momentum is not None:
            norm.momentum = cfg.model.bn_momentum
        if cfg.model.bn_eps is not None:
            norm.eps = cfg.model.bn_eps
        if cfg.train.bn_weight_frozen and norm.weight is not None:
            norm.weight.requires_grad_(False)  # stays at its init (1): no optimizer sees it
    return model


class ScaledLogits(torch.nn.Module):
    """`net`'s logits times a constant (model.head_scale; airbench's 1/9)."""

    def __init__(self, net: torch.nn.Module, scale: float):
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.scale


class Whitened(torch.nn.Module):
    """`net` behind a fixed patch-whitening convolution (airbench): k x k patches, no padding,
    2 C k^2 output channels, each whitening direction and its negative (the GELU or ReLU that
    follows keeps both signs). The weight is set by `fit_whitening` and never trained; the bias
    is trained (train.whiten_bias_epochs: for a while)."""

    def __init__(self, net: torch.nn.Module, in_chans: int, k: int):
        super().__init__()
        self.whiten = torch.nn.Conv2d(in_chans, self.width(in_chans, k), k, bias=True)
        self.whiten.weight.requires_grad_(False)
        self.net = net

    @staticmethod
    def width(in_chans: int, k: int) -> int:
        return 2 * in_chans * k * k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.whiten(x))


def fit_whitening(model: Whitened, images: torch.Tensor, eps: float = 5e-4) -> None:
    """The whitening weights from `images` ([N, C, H, W], normalised as training sees them):
    the eigenvectors of the patches' (uncentred) covariance, each scaled by 1/sqrt(eigenvalue +
    eps), so the first half of the outputs has an identity covariance on these images (where
    the eigenvalues dwarf eps). Computed in float64: a rerun on the same images gets the same
    weights."""
    layer = model.whiten
    c, k = layer.in_channels, layer.kernel_size[0]
    patches = images.double().unfold(2, k, 1).unfold(3, k, 1)  # N, C, H', W', k, k
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k)
    covariance = patches.T @ patches / len(patches)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
    scaled = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).flip(0)  # largest first
    weight = torch.cat([scaled, -scaled]).reshape(-1, c, k, k)
    with torch.no_grad():
        layer.weight.copy_(weight.to(layer.weight.dtype))


def whitening_layer(model: torch.nn.Module) -> torch.nn.Conv2d | None:
    return model.whiten if isinstance(model, Whitened) else None


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
    if cfg.train.compile != "off":
        model = compile_model(model, cfg.train.compile)
    return model


def compile_model(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """torch.compile in a `train.compile` mode: "default" is torch's own default mode."""
    return torch.compile(model, mode=None if mode == "default" else mode)
