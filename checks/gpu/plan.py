"""The check's steps in their order of value, each with its own timeout, all planned within
`BUDGET_S` on the device (setup included): a step cut short by the budget is a FAILED row with
what it measured so far, and the steps after it are "not started" rows.

Planned seconds on the GPU: setup 35 (35 wheels installed, CIFAR-10 extracted), paper 190, fast
110, syncs 35, gpu_tests 40, ablate 60: 470 of the 480 (8 minutes); ddp (two or more GPUs only)
gets what the others leave.
"""

from __future__ import annotations

from pathlib import Path

from checks.gpu import summaries
from checks.gpu.runner import Step

STEP_NAMES = ("paper", "fast", "syncs", "gpu_tests", "ablate", "ddp")
BUDGET_S = 470
TIMEOUTS = {"paper": 190, "fast": 110, "syncs": 35, "gpu_tests": 40, "ablate": 60, "ddp": 60}
DRY_BUDGET_S = 420
DRY_TIMEOUTS = {"paper": 90, "fast": 120, "syncs": 45, "gpu_tests": 40, "ablate": 90, "ddp": 60}
STEP_SETTLE_S = 25  # of a measuring step's timeout: loading its data, leaving before the kill
TARGET = 0.94  # the fast step's val_accuracy target
DRY_TARGET = 0.5  # digits in 2 epochs: reached, so time_to_target_s is a real number
ABLATE_CONFIG = "experiments/paper/cifar10_resnet50.yaml"
# ResNet50 at 32 px on 2,500 CIFAR-10 images, 2 epochs: whether amp and resident data still train
# on the GPU; the paper step answers the speed question at the size where it matters.
ABLATE = ("--techniques", "amp,resident")
# 32 images a batch: enough updates in 2 epochs to learn digits; fp32 (the fast recipe's bf16
# at its lr 0.2 with 32 images a batch diverges on 8 px digits)
DRY_OVERRIDES = ("data.dataset=digits", "model.name=accel_cnn_s", "train.epochs=2",
                 "train.device=cpu", "data.num_workers=0", "train.batch_size=32", "train.amp=off")
TITLES = {"paper": "The paper at 224 px (step paper)",
          "fast": "Time to 94%: accel against airbench94 (step fast)",
          "syncs": "Host-device syncs per update (step syncs)",
          "ablate": "Ablation (step ablate)", "ddp": "Several GPUs (step ddp)"}


def steps(py: str, dry: bool, data_root: Path, gpus: int = 1) -> list[Step]:
    """Every step, full size on the GPU, tiny on the CPU for a dry run."""
    timeouts = DRY_TIMEOUTS if dry else TIMEOUTS
    flag = ["--dry-run"] if dry else []
    paper = [py, "-m", "checks.gpu.paper", *flag, "--budget",
             str(timeouts["paper"] - STEP_SETTLE_S)]
    fast = [py, "-m", "checks.gpu.fast", *flag, "--target", str(DRY_TARGET if dry else TARGET)]
    syncs = [py, "-m", "checks.gpu.syncs", *flag, *(["--updates", "10"] if dry else [])]
    if dry:
        tests = [py, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                 "tests"]
        data = [*DRY_OVERRIDES, "data.train_limit=512"]
    else:
        tests = [py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-x", "tests"]
        data = ["data.dataset=imagefolder", f"data.root={data_root}", "data.val_fraction=0.1",
                "data.train_limit=2500", "train.epochs=2"]
    ablate = [py, "-m", "accel", "ablate", ABLATE_CONFIG, *ABLATE, *data, "--repeats", "1"]
    ddp = [py, "-m", "accel", "ablate", ABLATE_CONFIG, "--techniques", "ddp,amp", *data,
           "--repeats", "1"]
    one = "a dry run on CPU" if dry else "this machine has one GPU"
    made = {
        "paper": (paper, summaries.paper),
        "fast": (fast, summaries.fast),
        "syncs": (syncs, summaries.syncs),
        "gpu_tests": (tests, lambda text, env: summaries.tests(text, dry)),
        "ablate": (ablate, lambda text, env: summaries.ablation(text)),
        "ddp": (ddp, lambda text, env: summaries.ablation(text)),
    }
    return [Step(name, argv, timeouts[name], summarize, title=TITLES.get(name, ""),
                 skip="" if name != "ddp" or gpus >= 2 else
                 f"skipped: {one}; ddp needs two or more GPUs")
            for name, (argv, summarize) in made.items()]
