"""accel: faster single-GPU training of image classifiers, tuned with Optuna, tracked in MLflow."""

__version__ = "0.1.0"
