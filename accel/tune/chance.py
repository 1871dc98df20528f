"""A study that learned nothing: its best accuracy-like value (val_accuracy, val_f1, ...) within
noise of chance for its task (1/K for K classes). Tuning's noise can make the best of many
chance-level trials look like a result, and `accel best --register` would then publish it as a
champion; `accel tune`, `accel best` and `--register` say so instead (`--register` refuses
without `--force`).

Noise: three binomial standard errors of an accuracy of 1/K on the run's validation images
(sqrt(p(1 - p) / n)), and at least 2 points; where the validation size is not logged, 5 points.
"""

from __future__ import annotations

import math

ACCURACY_LIKE = ("accuracy", "f1")
MIN_MARGIN, UNKNOWN_MARGIN = 0.02, 0.05


def chance_level(metric: str, value: float, num_classes: int | None,
                 n_val: int | None) -> str | None:
    """Why `value` of `metric` is within noise of chance, or None where it is not (or the
    metric is no accuracy, or the task's classes are unknown)."""
    if not any(word in metric for word in ACCURACY_LIKE) or not num_classes or num_classes < 2:
        return None
    chance = 1.0 / num_classes
    if n_val:
        margin = max(MIN_MARGIN, 3 * math.sqrt(chance * (1 - chance) / n_val))
        noise = f"3 standard errors on {n_val} validation images"
    else:
        margin, noise = UNKNOWN_MARGIN, "the validation size is not logged"
    if value > chance + margin:
        return None
    return (f"{metric}={value:.4f} is within noise of chance for {num_classes} classes "
            f"({chance:.3f} + {margin:.3f}: {noise}): the study has not learned the task")


def of_run(tracker, run_id: str | None, metric: str, value: float) -> str | None:
    """`chance_level` for a trial's run, from the classes and validation size it logged."""
    if run_id is None:
        return None
    try:
        params = tracker.client.get_run(run_id).data.params
    except Exception:  # the run is gone, or the store away: no warning rather than a failure
        return None
    classes, n_val = params.get("resolved.num_classes"), params.get("resolved.val_size")
    return chance_level(metric, value, int(classes) if classes else None,
                        int(n_val) if n_val else None)
