"""Does `train.amp=auto` pick the faster precision on this machine? Side by side, per recipe:

    .venv/bin/python bench/amp_auto.py [--rounds 5] [--steps 20] [--recipes fast,quickstart]

For each recipe (experiments/cifar10_fast.yaml, experiments/quickstart.yaml) this builds the run
twice in this process, `train.amp=off` and `train.amp=bf16`, exactly as `accel train` builds it
(data, model, whitening, optimizer, the bf16 conv guard, channels_last), and times `--steps` of
its real update steps on its real batches per round, the two alternating. It also runs auto's
probe afresh (accel.train.amp_probe.probe: copies of the model on random batches, the cache left
alone) and prints what auto would choose, then whether that is the precision the side-by-side
measurement found faster. Last line per recipe: the median fp32 / bf16 step-time ratio and its
per-round spread. The fast recipe needs CIFAR-10 (`python -m accel.shared_data`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import print_ratio, ratio, summary, time_rounds  # noqa: E402

RECIPES = {"fast": "experiments/cifar10_fast.yaml", "quickstart": "experiments/quickstart.yaml"}


def stepper(built, batches):
    """All of `batches` through the run's own update step (what UpdateStep reads of Ignite's
    engine: the position in the epoch)."""

    class State:
        epoch_length, iteration = 10**6, 0

    engine = type("Engine", (), {"state": State()})()

    def run() -> None:
        for i, batch in enumerate(batches, 1):
            engine.state.iteration = i
            built.step(engine, batch)

    return run


def compare(recipe: str, rounds: int, steps: int) -> None:
    import torch

    from accel import config
    from accel.tracking.environment import cpu_name
    from accel.train import amp_probe, parts

    common = ["train.device=cpu", "train.budget_s=null", f"train.epoch_length={steps}"]
    builds = {name: parts.build(config.load(ROOT / recipe, [*common, f"train.amp={amp}"]))
              for name, amp in (("fp32", "off"), ("bf16", "bf16"))}
    built = builds["fp32"]
    cfg, data = built.cfg, built.data
    shape = (cfg.train.batch_size, data.in_chans, data.img_size, data.img_size)
    probed = amp_probe.probe(built.bare, cfg, built.device, shape, data.num_classes)
    auto = "bf16" if probed["bf16"] < probed["fp32"] else "fp32"
    runs = {}
    for name, b in builds.items():
        loader = iter(b.data.train)
        runs[name] = stepper(b, [next(loader) for _ in range(min(steps, len(b.data.train)))])
    times = time_rounds(runs, rounds)
    print(f"\n{recipe}: {cfg.model.name}, batch {cfg.train.batch_size}, {cpu_name()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"  auto's probe: fp32 {probed['fp32'] * 1000:.1f} ms, bf16 {probed['bf16'] * 1000:.1f}"
          f" ms an update -> {auto}")
    for name, ts in times.items():
        print(f"  {name} {summary(ts)}  ({len(ts)} rounds of {steps} steps)")
    med, _, _ = ratio(times, "fp32", "bf16")
    faster = "bf16" if med > 1 else "fp32"
    print(f"  faster side by side: {faster}; auto picked the faster: "
          f"{'yes' if auto == faster else 'NO'}")
    print_ratio(times, "fp32", "bf16", "  bf16 speed-up, step times (fp32 / bf16)", ".2f")
    for b in builds.values():
        b.data.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="update steps per round")
    ap.add_argument("--recipes", default="fast,quickstart",
                    help=f"comma-separated, of: {', '.join(RECIPES)}")
    args = ap.parse_args()
    chosen = args.recipes.split(",")
    unknown = [r for r in chosen if r not in RECIPES]
    if unknown:
        print(f"bench/amp_auto.py: --recipes {','.join(unknown)}: not one of "
              f"{', '.join(RECIPES)}", file=sys.stderr)
        raise SystemExit(2)
    for name in chosen:
        compare(RECIPES[name], args.rounds, args.steps)


if __name__ == "__main__":
    main()
