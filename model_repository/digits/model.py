"""Handwritten digits (8x8 images, scaled to 0..1) classified by a scikit-learn random forest,
served through sheaf's batched API: `infer` gets every request of a batch concatenated along
the first axis, and sheaf slices the answer back to each request."""
import pickle
from pathlib import Path

import numpy as np

model = None


def load(config):
    global model
    with open(Path(config["model_dir"]) / "estimator.pkl", "rb") as f:
        model = pickle.load(f)


def infer(inputs):
    probabilities = model.predict_proba(inputs["pixels"]).astype(np.float32)
    label = model.classes_[np.argmax(probabilities, axis=1)].astype(np.int64)[:, None]
    return {"probabilities": probabilities, "label": label}
