"""airbench94 (Jordan 2024, PyPI `airbench==0.1.8`) run by its own code on any device.

The package trains on CUDA only: `make_net94` ends in `.half().cuda()`, `train` times with CUDA
events and reads its test set from `./cifar10/test.pt` on GPU 0. On a GPU the check calls the
package untouched (`train94`, cwd beside `cifar10/`). On a CPU `train_on` runs the package's
same `train` function with four things moved: the network stays fp32 on the CPU (bf16 by
autocast where asked, without autocast's weight cache: the CPU has no fast fp16), its loaders
read their tensors to the CPU as fp32, CUDA events become a wall clock, and the whitening layer's
covariance stays fp32 under autocast. The training itself (data order, augmentation, optimizer,
schedule, Lookahead, whitening, TTA) is airbench's own code.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch


def load():
    """The airbench package: installed, or the wheel `make gpu-wheels` built (pure Python)."""
    try:
        import airbench
    except ImportError:
        from checks.gpu.carry import airbench_wheel

        wheel = airbench_wheel()
        if wheel is None:
            raise SystemExit("airbench is not installed and .gpu/wheels has no airbench wheel: "
                             "run `make gpu-wheels`") from None
        sys.path.insert(0, str(wheel))
        import airbench
    return airbench


class _Clock:
    """torch.cuda.Event's part that airbench uses, on the host clock."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3  # ms, as CUDA events


@contextlib.contextmanager
def _cpu(ab, amp: str):
    """airbench's train moved to the CPU (see the module's docstring)."""
    def loader(*args, **kwargs):
        made = real_loader(*args, **{**kwargs, "gpu": "cpu"})
        made.images = made.images.float()
        return made

    def whiten(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return real_whiten(*args, **kwargs)

    real_loader, real_whiten = ab.utils.CifarLoader, ab.utils.init_whitening_conv
    moved = ((torch.nn.Module, "half", lambda self: self),
             (torch.nn.Module, "cuda", lambda self, *a, **k: self),
             (torch.cuda, "Event", lambda **k: _Clock()),
             (torch.cuda, "synchronize", lambda *a: None),
             (ab.utils, "CifarLoader", loader),
             (ab.utils, "init_whitening_conv", whiten))
    with contextlib.ExitStack() as stack:
        for target, name, value in moved:
            stack.enter_context(mock.patch.object(target, name, value))
        if amp == "bf16":
            # One autocast region spans airbench's whole training loop, so its cache of the
            # weights' bf16 copies is off: with it, every forward would reuse the copies cast at
            # the first one and the network would train blind to its own updates.
            stack.enter_context(torch.autocast("cpu", torch.bfloat16, cache_enabled=False))
        yield loader


def train_on(data: Path, device: str, *, seed: int, amp: str = "off", epochs: float | None = None,
             tta_level: int = 2, batch_size: int | None = None) -> dict:
    """One airbench94 training on `data`/{train,test}.pt: seconds (airbench's own clock:
    whitening init and training, evaluation excluded) and test accuracy (its TTA)."""
    ab = load()
    hyp = ab.lib_airbench94.hyp
    epochs = hyp["opt"]["train_epochs"] if epochs is None else epochs
    torch.manual_seed(seed)
    here = os.getcwd()
    os.chdir(data.parent)  # airbench reads ./cifar10/test.pt
    try:
        with _cpu(ab, amp) if device == "cpu" else contextlib.nullcontext(ab.CifarLoader) as cl:
            train = cl(str(data), train=True, batch_size=batch_size or hyp["opt"]["batch_size"],
                       aug=hyp["aug"], altflip=True)
            sync(device)
            began = time.perf_counter()
            model = ab.train94(train, epochs=epochs, verbose=False)
            sync(device)
            seconds = time.perf_counter() - began
            test = cl(str(data), train=False, batch_size=2000)
            with torch.autocast("cpu", torch.bfloat16) if amp == "bf16" else \
                    contextlib.nullcontext():
                accuracy = ab.evaluate(model, test, tta_level=tta_level)
    finally:
        os.chdir(here)
    return {"seconds": seconds, "test_acc": accuracy, "epochs": epochs,
            "train_images": len(train.labels)}


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


@functools.cache
def hyperparameters() -> dict:
    return load().lib_airbench94.hyp


# accel's fast recipe (experiments/cifar10_fast.yaml) set to airbench94's hyperparameters
# (`hyp` of lib_airbench94). airbench sums the loss over the batch with lr 11.5 per 1024 images
# over a kilostep scale of 1024 (1 + 1 / (1 - momentum)); accel averages it, so its lr is that
# times 1024: 11.5 / (1 + 1 / 0.15) = 1.5. airbench's decay is 0.0153 x 1024 / 7851 = 0.0019957
# of each weight per update at the peak lr; torch's SGD decays lr x weight_decay, so
# weight_decay = 0.0019957 / 1.5. Its triangle peaks at 23% of the updates from 0.2 to 0.07.
# Its BatchNorm biases train at 64 x lr, its whitening bias (held after 3 epochs) at 1 x lr,
# and both decay by the same 0.0019957 of themselves per update as the weights (accel's bias
# groups: weight_decay / 64 and / 1, accel.param_groups.bias_decay). Its Lookahead writes its
# average back every 5 updates with decay 0.95^5 (t / T)^3 and ends on it (what is scored: the
# network, no separate moving average); its BatchNorms have eps 1e-12, momentum 0.6 (0.4 in
# PyTorch's sense), its whitening bias starts at zero, and its logits are scaled by 1/9.
AIRBENCH_PEAK = 0.23  # utils.train: triangle(total_train_steps, start=0.2, end=0.07, peak=0.23)
AIRBENCH_OVERRIDES = ("train.batch_size=1024", "train.epochs=10", "train.lr=1.5",
                      "train.momentum=0.85", "train.weight_decay=1.3305e-3",
                      "train.warmup_epochs=2.3", "train.lr_start=0.2", "train.lr_end=0.07",
                      "train.label_smoothing=0.2", "train.bn_bias_lr_scale=64",
                      "train.whiten_bias_lr_scale=1", "train.bn_bias_decay=true",
                      "train.whiten_bias_epochs=3", "train.ema_decay=null",
                      "train.lookahead_decay=0.95", "train.lookahead_every=5",
                      "model.bn_momentum=0.4", "model.bn_eps=1e-12", "model.whiten_bias_zero=true",
                      "model.head_scale=0.1111111111111111")


def accel_overrides(epochs: int = 10) -> list[str]:
    """AIRBENCH_OVERRIDES for a run of `epochs` whole epochs, with the recipe's wall-clock
    budget (train.budget_s, where this checkout has it) off: airbench trains a fixed number of
    updates. airbench lays its triangle over however many epochs it trains (its peak at
    AIRBENCH_PEAK of the updates); accel's `train.warmup_epochs` is a count of epochs, so it is
    set to that share of `epochs` here. The whitening bias's hold stays at 3 epochs: airbench's
    is a count of epochs too."""
    from accel.config import all_keys

    return [*AIRBENCH_OVERRIDES, f"train.epochs={epochs}",
            f"train.warmup_epochs={round(AIRBENCH_PEAK * epochs, 6)}",
            *(["train.budget_s=null"] if "train.budget_s" in all_keys() else [])]


# What stays different, read from airbench's source (lib_airbench94.py, utils.py) against
# accel's: printed with peer_airbench.py's table.
DIFFERENCES = (
    "epochs: accel trains whole epochs, by default 10 (480 updates) for airbench's 9.9 (476); "
    "with --epochs N both train N (48 N updates)",
    "schedule: accel's warm-up multiplier for update u (from 0) is 0.2 + 0.8 (u + 1) / W, W = 23% "
    "of its updates (110 of 480), at the peak for updates W - 1 and W; airbench's triangle is "
    "0.2 + 0.8 u / W' (W' = int(0.23 x its updates), 109 of 476), at most one update behind",
    "Lookahead start: airbench's average is taken before its whitening layer is fitted, so its "
    "first write-back (update 5, decay 9e-7) keeps 9e-7 of the unfitted whitening weights (below "
    "fp16's resolution on a GPU); accel's average starts from the fitted layer",
    "precision: airbench's network is fp16 (weights too) on a GPU and fits its whitening in "
    "fp32; accel fits it in fp64; on the CPU both sides train in fp32 (or bf16 autocast with "
    "fp32 weights)",
)
