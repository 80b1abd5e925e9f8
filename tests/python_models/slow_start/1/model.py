"""y = x + 1, after a load (as a heavy import would) that takes 1.5 s."""
import time

time.sleep(1.5)


def infer(inputs):
    return {"y": inputs["x"] + 1}
