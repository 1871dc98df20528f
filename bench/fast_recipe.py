"""Time to accuracy of `experiments/cifar10_fast.yaml` on this machine.

1. The recipe as configured, once: validation accuracy after every epoch against the training
   seconds so far (evaluation excluded, as `time_to_target_s`), the test accuracy at the end, and
   the curve as a PNG.
2. Each ingredient's effect: the recipe with one ingredient taken out at a time, all at a smaller
   budget (`--epochs`, `--train-limit`), over `--rounds` seeds (round r trains with seed + r: its
   own split, initialisation and order; the variants of a round in alternating order). Per
   variant: the test accuracy's mean and range, and its difference to the recipe, paired by seed,
   with a 95% Student-t interval (`accel.verify.stats.paired_difference`, as `accel verify`);
   "beyond noise" says whether the interval excludes 0. Few seeds give a coarse interval.

    python -m accel.shared_data                 # the shared CIFAR-10, extracted once
    python bench/fast_recipe.py                 # both parts (over an hour on 2 cores)
    python bench/fast_recipe.py --skip-ingredients
    python bench/fast_recipe.py --skip-recipe --rounds 3
    python bench/fast_recipe.py --skip-recipe --only jitter \
        --recipe experiments/cifar10_fast_muon.yaml

Runs are in this process and untracked (`track=False`): the numbers are the runs' own histories.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "experiments" / "cifar10_fast.yaml"
# name -> the overrides that take one ingredient out
VARIANTS = {
    "recipe": [],
    "- whitened first layer (the stem conv)": ["model.whiten=0",
                                               "train.whiten_bias_epochs=null"],
    "- dirac init": ["model.dirac_init=false"],
    "- batchnorm settings (bias lr x1, weights trained, momentum 0.1)": [
        "train.bn_bias_lr_scale=1", "train.bn_weight_frozen=false", "model.bn_momentum=null"],
    "- moving average of the weights": ["train.ema_decay=null"],
    "- alternating flip (random)": ["data.flip=random"],
    "- 2 px translate (4 px)": ["data.translate=null"],
    "- multi-crop tta (flip tta)": ["eval.tta=flip"],
    "- bf16 autocast (fp32)": ["train.amp=off"],
    "- logits scaled by 1/9 (1)": ["model.head_scale=1"],
    "- triangle schedule's ends (from and to 0)": ["train.lr_start=0", "train.lr_end=0"],
    "+ colour jitter 0.15 (hiverge)": ["data.color_jitter=0.15"],
}


def run(recipe: Path, overrides: list[str]):
    from accel import config
    from accel.train import train

    cfg = config.load(recipe, overrides)
    began = time.perf_counter()
    result = train(cfg, track=False)
    return result, time.perf_counter() - began


def curve(result) -> list[tuple[int, float, float]]:
    """(epoch, training seconds so far, val_accuracy) per epoch."""
    out, seconds = [], 0.0
    for epoch, row in enumerate(result.history, 1):
        seconds += row["epoch_time_s"]
        out.append((epoch, seconds, row["val_accuracy"]))
    return out


def recipe_part(recipe: Path, extra: list[str], png: Path) -> None:
    result, wall = run(recipe, extra)
    points = curve(result)
    print("\n| epoch | training s | val accuracy |\n|---|---|---|")
    for epoch, seconds, acc in points:
        print(f"| {epoch} | {seconds:.0f} | {acc:.4f} |")
    m = result.metrics
    hit = next(((e, s) for e, s, a in points if a >= 0.9), None)
    print(f"\ntest accuracy {m.get('test_accuracy', float('nan')):.4f} after {points[-1][1]:.0f} s "
          f"of training ({wall:.0f} s wall, evaluation and data loading included); "
          + (f"val_accuracy >= 0.9 at epoch {hit[0]}, {hit[1]:.0f} s" if hit
             else "val_accuracy 0.9 not reached"))
    plot(points, m.get("test_accuracy"), png)


def plot(points, test_accuracy, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([s / 60 for _, s, _ in points], [a for *_, a in points], marker="o",
            label="val accuracy (5,000 held-out train images)")
    if test_accuracy is not None:
        ax.plot(points[-1][1] / 60, test_accuracy, "s", color="tab:red",
                label=f"test accuracy {test_accuracy:.3f}")
    ax.axhline(0.9, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xlabel("training time, minutes (evaluation excluded)")
    ax.set_ylabel("accuracy")
    ax.set_title("experiments/cifar10_fast.yaml on this CPU", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"curve: {png}")


def ingredients_part(recipe: Path, extra: list[str], rounds: int, seed: int,
                     only: list[str]) -> None:
    """Every variant (or the recipe and those whose names contain one of `only`) once per
    round, the order reversed every other round; round r trains with `train.seed=seed + r` (its
    own split, initialisation and order), so the spread is seeds'."""
    names = [n for n in VARIANTS if n == "recipe" or not only or any(o in n for o in only)]
    seen: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            result, _ = run(recipe, [*extra, *VARIANTS[name], f"train.seed={seed + r}"])
            train_s = sum(row["epoch_time_s"] for row in result.history)
            seen[name].append((result.metrics.get("test_accuracy", float("nan")), train_s))
            print(f"r{r + 1} {name}: test {seen[name][-1][0]:.4f} training {train_s:.0f} s",
                  flush=True)
    print(f"\n{rounds} round(s), seeds {seed}..{seed + rounds - 1}, {' '.join(extra)}\n")
    print(table(seen))


def table(seen: dict[str, list[tuple[float, float]]]) -> str:
    """The markdown table of `ingredients_part`: `seen[variant]` = (test accuracy, training s)
    per seed, in seed order; the first variant is the recipe."""
    from accel.verify.stats import paired_difference

    names = list(seen)
    base = [t for t, _ in seen[names[0]]]
    lines = ["| variant | test acc, mean (min–max) | Δ vs recipe, mean [95% interval] | "
             "beyond noise | training s |", "|---|---|---|---|---|"]
    for name in names:
        tests = [t for t, _ in seen[name]]
        secs = statistics.median(s for _, s in seen[name])
        cells = [f"{statistics.mean(tests):.4f} ({min(tests):.4f}–{max(tests):.4f})"]
        if name == names[0]:
            cells += ["", ""]
        else:
            d = paired_difference(tests, base)
            noise = "no" if d.contains(0.0) else ("higher" if d.low > 0 else "lower")
            cells += [f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]", noise]
        lines.append(f"| {name} | {' | '.join(cells)} | {secs:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-recipe", action="store_true")
    ap.add_argument("--skip-ingredients", action="store_true")
    ap.add_argument("--epochs", type=int, default=4, help="ingredient runs: epochs")
    ap.add_argument("--train-limit", type=int, default=20000, help="ingredient runs: images")
    ap.add_argument("--rounds", type=int, default=3, help="ingredient runs: seeds")
    ap.add_argument("--seed", type=int, default=0, help="ingredient runs: the first round's seed")
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="the experiment file")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="ingredient runs: the recipe and the variants whose names contain TEXT "
                         "(repeatable); all by default")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "fast-recipe-cpu.png")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    args = ap.parse_args()
    variants = [n for n in VARIANTS if n != "recipe"]
    if args.only and not any(o in n for o in args.only for n in variants):
        ap.error(f"--only {' '.join(args.only)}: no variant's name contains it; the variants: "
                 + "; ".join(variants))
    from accel.tracking import cpu_name

    print(f"machine: {cpu_name()}; {args.recipe.name}; overrides {args.overrides or 'none'}")
    if not args.skip_recipe:
        recipe_part(args.recipe, args.overrides, args.png)
    if not args.skip_ingredients:
        ingredients_part(args.recipe, [*args.overrides, "train.budget_s=null",
                                       f"train.epochs={args.epochs}",
                                       f"data.train_limit={args.train_limit}"],
                         args.rounds, args.seed, args.only)


if __name__ == "__main__":
    main()
