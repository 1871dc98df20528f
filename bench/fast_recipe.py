"""Time to accuracy of `experiments/cifar10_fast.yaml` on this machine.

1. The recipe as configured, once: validation accuracy after every epoch against the training
   seconds so far (evaluation excluded, as `time_to_target_s`), the test accuracy at the end, and
   the curve as a PNG.
2. Each ingredient's effect: the recipe with one ingredient taken out at a time, all at a smaller
   budget (`--epochs`, `--train-limit`), run in alternation round by round, against the recipe
   itself at that budget. Ingredients: label smoothing, Nesterov (-> heavy-ball SGD), linear decay
   (-> cosine), flip TTA (-> none: the same weights, on CPU, so only the scoring differs),
   channels_last, resident data (-> the in-memory DataLoader), and bf16 autocast (added).

    python -m accel.shared_data                 # the shared CIFAR-10, extracted once
    python bench/fast_recipe.py                 # both parts (about 30 min on 2 cores)
    python bench/fast_recipe.py --skip-ingredients
    python bench/fast_recipe.py --skip-recipe --rounds 2

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
# name -> the overrides that take one ingredient out (or, for bf16, put one in)
VARIANTS = {
    "recipe": [],
    "- label smoothing": ["train.label_smoothing=0"],
    "- nesterov (heavy-ball sgd)": ["train.optimizer=sgd"],
    "- linear decay (cosine)": ["train.scheduler=cosine"],
    "- flip tta": ["eval.tta=none"],
    "- channels_last": ["train.channels_last=false"],
    "- resident data (in-memory DataLoader)": ["data.on_device=false", "data.in_memory=true"],
    "+ bf16 autocast": ["train.amp=bf16"],
}


def run(overrides: list[str]):
    from accel import config
    from accel.train import train

    cfg = config.load(RECIPE, overrides)
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


def recipe_part(extra: list[str], png: Path) -> None:
    result, wall = run(extra)
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


def ingredients_part(extra: list[str], rounds: int, seed: int) -> None:
    """Every variant once per round, the order reversed every other round; round r trains with
    `train.seed=seed + r` (its own split, initialisation and order), so the spread is seeds'."""
    names = list(VARIANTS)
    seen: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            result, _ = run([*extra, *VARIANTS[name], f"train.seed={seed + r}"])
            train_s = sum(row["epoch_time_s"] for row in result.history)
            seen[name].append((result.history[-1]["val_accuracy"],
                               result.metrics.get("test_accuracy", float("nan")), train_s))
            print(f"r{r + 1} {name}: val {seen[name][-1][0]:.4f} test {seen[name][-1][1]:.4f} "
                  f"training {train_s:.0f} s", flush=True)
    base = seen["recipe"]
    print(f"\n{rounds} round(s), seeds {seed}..{seed + rounds - 1}, {' '.join(extra)}\n")
    print("| variant | test accuracy (min–max) | Δ test vs recipe | training s | time ratio |")
    print("|---|---|---|---|---|")
    for name in names:
        tests = [t for _, t, _ in seen[name]]
        secs = [s for *_, s in seen[name]]
        delta = statistics.median(t - b[1] for t, b in zip(tests, base, strict=True))
        ratio = statistics.median(s / b[2] for s, b in zip(secs, base, strict=True))
        print(f"| {name} | {statistics.median(tests):.4f} ({min(tests):.4f}–{max(tests):.4f}) | "
              f"{delta:+.4f} | {statistics.median(secs):.0f} | {ratio:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-recipe", action="store_true")
    ap.add_argument("--skip-ingredients", action="store_true")
    ap.add_argument("--epochs", type=int, default=4, help="ingredient runs: epochs")
    ap.add_argument("--train-limit", type=int, default=20000, help="ingredient runs: images")
    ap.add_argument("--rounds", type=int, default=1, help="ingredient runs: rounds")
    ap.add_argument("--seed", type=int, default=0, help="ingredient runs: the first round's seed")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "fast-recipe-cpu.png")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    args = ap.parse_args()
    from accel.tracking import cpu_name

    print(f"machine: {cpu_name()}; {RECIPE.name}; overrides {args.overrides or 'none'}")
    if not args.skip_recipe:
        recipe_part(args.overrides, args.png)
    if not args.skip_ingredients:
        ingredients_part([*args.overrides, f"train.epochs={args.epochs}",
                          f"data.train_limit={args.train_limit}"], args.rounds, args.seed)


if __name__ == "__main__":
    main()
