"""What the fast recipe's evaluation costs each epoch with multi-crop TTA (experiments/
cifar10_fast.yaml: 6 forward passes an image) and without it (eval.tta_every_epoch=false: one
pass an image, TTA for the final scores only), beside its training, on this machine:

    .venv/bin/python bench/eval_tta.py [--rounds 3] [--batches 4]

One run of the recipe is built as `accel train` builds it (data resident, the network behind its
whitening layer, the precision train.amp=auto picks here). Each round times `--batches` updates,
then the evaluation of `--batches` validation batches with TTA and without it, in alternation
(bench/common.py). Printed: the CPU, torch and its threads; each contender's median; seconds per
image of each; the share of an epoch (the recipe's training images and validation images at
those rates) that its evaluation takes either way; the median ratio of the two evaluations with
its per-round spread. Needs CIFAR-10 (`python -m accel.shared_data`).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import cpu_line, print_ratio, summary, time_rounds  # noqa: E402

RECIPE = "experiments/cifar10_fast.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=4)
    args = p.parse_args(argv)
    from accel import config
    from accel.train.parts import build

    cfg = config.load(Path(RECIPE), ["train.budget_s=null", "tracking.system_metrics=false"])
    run = build(cfg)
    val = list(itertools.islice(iter(run.data.val), args.batches))

    def updates() -> None:  # the trainer alone: no handler attached, nothing logged
        run.trainer.run(run.data.train, max_epochs=1, epoch_length=args.batches)

    def evaluation(tta: str):
        def go() -> None:
            run.evaluator.tta = tta
            run.evaluator.run(val)
        return go

    contenders = {"train": updates, "eval multicrop": evaluation("multicrop"),
                  "eval none": evaluation("none")}
    print(f"{cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.batches} batches of {cfg.train.batch_size}, {args.rounds} rounds")
    times = time_rounds(contenders, args.rounds)
    images = args.batches * cfg.train.batch_size
    per_image = {name: statistics.median(t) / images for name, t in times.items()}
    train_images, val_images = len(run.data.train.dataset), len(run.data.val.dataset)
    for name, t in times.items():
        print(f"{name:15s} {summary(t)}  {per_image[name] * 1e3:.3f} ms an image")
    for name in ("eval multicrop", "eval none"):
        evaluating = val_images * per_image[name]
        share = evaluating / (train_images * per_image["train"] + evaluating)
        print(f"{name}: {evaluating:.1f} s an epoch ({val_images} images), {share:.1%} of an "
              f"epoch of {train_images} training images")
    print_ratio(times, "eval multicrop", "eval none", "multicrop / none, an evaluation", ".2f")
    return 0


if __name__ == "__main__":
    sys.exit(main())
