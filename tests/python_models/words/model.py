import numpy as np


def infer(inputs):
    text = inputs["text"]  # an object array of bytes, one row per item of the batch
    reversed_ = np.array([[t[::-1] for t in row] for row in text], dtype=np.object_)
    length = np.array([[len(t) for t in row] for row in text], dtype=np.int64)
    return {"reversed": reversed_, "length": length}
