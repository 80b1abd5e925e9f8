"""sheaf's batched API with an `async def is_ready()`: ready while the file `state` in its
folder is absent or says "yes"."""

import asyncio
import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


async def is_ready():
    await asyncio.sleep(0.01)
    try:
        with open(os.path.join(FOLDER, "state")) as f:
            return f.read().strip() == "yes"
    except FileNotFoundError:
        return True


def infer(inputs):
    return {"y": inputs["x"] * 2}
