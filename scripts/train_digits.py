"""Trains the `digits` demo model: a scikit-learn random forest on the 8x8 handwritten digits
data set that scikit-learn ships (no download), pickled beside the model's model.py.

Usage: train_digits.py OUT.pkl
"""
import pickle
import sys

from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier


def main(out):
    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    model = RandomForestClassifier(n_estimators=100, max_depth=12, random_state=0, n_jobs=1)
    model.fit(x[:1500], digits.target[:1500])
    accuracy = model.score(x[1500:], digits.target[1500:])
    with open(out + ".part", "wb") as f:
        pickle.dump(model, f)
    import os
    os.replace(out + ".part", out)
    print(f"digits: held-out accuracy {accuracy:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
