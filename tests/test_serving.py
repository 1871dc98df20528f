"""A registered model people can call: it takes float images in [0, 1] (NCHW at the trained
size), normalises inside, and names its classes in its metadata. Loaded in a fresh process
without accel, through MLflow's pyfunc and the scoring server's /invocations handler, it
predicts what `accel evaluate` scored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import TINY_OVERRIDES, run_in_process

# What a user runs, without accel: the README's serving example, called in-process. The
# payload is what `curl -d @payload.json localhost:PORT/invocations` sends.
CALLER = """
import json, sys
import mlflow, numpy as np
from mlflow.pyfunc.scoring_server import invocations

uri, images = sys.argv[1], np.load(sys.argv[2])
model = mlflow.pyfunc.load_model(uri)
classes = model.metadata.metadata["classes"]
direct = model.predict(images).argmax(axis=1)
payload = json.dumps({"inputs": images.tolist()})
answer = invocations(payload, "application/json", model, model.metadata.get_input_schema())
served = np.array(json.loads(answer.response)["predictions"]).argmax(axis=1)
print(json.dumps({"status": answer.status, "classes": classes,
                  "input": model.metadata.metadata["input"],
                  "direct": [classes[i] for i in direct], "served": [classes[i] for i in served]}))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A one-trial digits study, its trial registered as served@champion: (store, run id)."""
    tmp = tmp_path_factory.mktemp("serving")
    exp = tmp / "s.yaml"
    tiny = dict(item.split("=", 1) for item in TINY_OVERRIDES)
    exp.write_text(yaml.safe_dump({"search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 5.0e-3, "high": 7.0e-3}}}}))
    store = f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}"
    where = ["--storage", str(tmp / "optuna.journal"), "--tracking-uri", store]
    tiny.update({"train.epochs": "3", "train.epoch_length": "10"})  # enough to learn digits
    overrides = [f"{k}={v}" for k, v in tiny.items()] + ["tracking.system_metrics=false"]
    tune = run_in_process("tune", str(exp), *overrides, "--study", "s", "--n-trials", "1",
                          *where)
    assert tune.returncode == 0, tune.stderr[-2000:]
    best = run_in_process("best", "--study", "s", "--register", "served", *where)
    assert best.returncode == 0, best.stderr[-2000:]
    run_id = next(line.split()[2] for line in best.stdout.splitlines()
                  if line.startswith("mlflow run:"))
    return store, run_id


def unit_images(side: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The trial's validation images as users have them: float32 [N, 1, side, side] in [0, 1]
    (digits' 0..16 scaled, resized to the trained side), and their labels."""
    import torch

    from accel.data import load_digits_arrays, split_indices

    images, labels = load_digits_arrays()
    _, val = split_indices(len(labels), 0.1, 0)
    x = torch.tensor(images[val], dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear",
                                        align_corners=False)
    return x.numpy(), labels[val]


def test_a_fresh_process_calls_the_registered_model_on_0_1_images(served, tmp_path):
    from mlflow.tracking import MlflowClient

    store, run_id = served
    images, labels = unit_images()
    np.save(tmp_path / "images.npy", images)
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    proc = subprocess.run([sys.executable, "-c", CALLER, "models:/served@champion",
                           str(tmp_path / "images.npy")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == 200
    assert answer["classes"] == [str(c) for c in range(10)]
    assert answer["input"] == "float32 NCHW [0, 1]"
    assert answer["served"] == answer["direct"]
    accuracy = float(np.mean(np.array(answer["direct"]) == labels.astype(str)))
    # accel's own evaluation of the same model on the same split scores the same predictions
    # (here, in-process: the fresh process above is the one without accel).
    evaluation = run_in_process("evaluate", "models:/served@champion", "--tracking-uri", store)
    assert evaluation.returncode == 0, evaluation.stderr[-2000:]
    eval_run = evaluation.stdout.split("mlflow run: ")[1].split()[0]
    c = MlflowClient(store)
    assert c.get_run(eval_run).data.metrics["val_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert c.get_run(run_id).data.metrics["best_val_accuracy"] == pytest.approx(accuracy,
                                                                                abs=1e-6)
    assert accuracy > 0.3  # it learned (chance: 0.1): the predictions line up with the class names


def test_the_model_refuses_images_of_another_size(served):
    """NCHW at the trained size only: 8x8 digits are refused, not silently misread (the model
    loaded here, through MLflow's pyfunc: the refusal is the model's, in any process)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    store, _ = served
    images, _ = unit_images(side=8)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(store)
    try:
        model = mlflow.pyfunc.load_model("models:/served@champion")
    finally:
        mlflow.set_tracking_uri(before)
    assert model.predict(unit_images()[0]).shape == (len(images), 10)  # its own size is taken
    with pytest.raises(MlflowException, match="(?i)shape"):
        model.predict(images)


def test_the_serving_recipe_works_as_pasted_against_mlflow_models_serve(served, tmp_path):
    """docs/registry.md's recipe: `mlflow models serve` on the registered model with the store
    named by MLFLOW_TRACKING_URI, [0, 1] images posted to /invocations, logits back, the class
    names from the model's metadata. The same pictures as 0-255 pixels get the same answers;
    nothing is written where the server runs."""
    import socket
    import time
    import urllib.request

    import mlflow

    from tests.conftest import stop_group

    store, _ = served
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = str(Path(sys.executable).parent)  # .venv activated: mlflow and uvicorn on PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": store,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["mlflow", "models", "serve", "-m", "models:/served@champion",
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                if urllib.request.urlopen(f"{base}/ping", timeout=2).status == 200:
                    break
            except OSError:
                assert time.time() < deadline, "the server did not answer /ping in time"
                time.sleep(0.5)
        images, labels = unit_images()

        def predict(x: np.ndarray) -> np.ndarray:
            req = urllib.request.Request(f"{base}/invocations",
                                         json.dumps({"inputs": x.tolist()}).encode(),
                                         {"Content-Type": "application/json"})
            return np.array(json.load(urllib.request.urlopen(req, timeout=60))["predictions"])

        logits = predict(images)
        pixels = predict(np.round(images * 255).astype(np.float32))
    finally:
        stop_group(proc)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(store)
    try:
        classes = mlflow.models.get_model_info("models:/served@champion").metadata["classes"]
    finally:
        mlflow.set_tracking_uri(before)
    assert logits.shape == (len(images), 10) and classes == [str(c) for c in range(10)]
    named = [classes[i] for i in logits.argmax(1)]
    assert np.mean(np.array(named) == labels.astype(str)) > 0.3  # it learned (chance: 0.1)
    assert (pixels.argmax(1) == logits.argmax(1)).mean() >= 0.98  # 8-bit rounding aside
    assert not list(tmp_path.glob("*.db")) and not (tmp_path / "mlruns").exists()
