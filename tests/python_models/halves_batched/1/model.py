"""BF16 through sheaf's batched API: `x` arrives as ml_dtypes' bfloat16, and twice it goes back
in the same type; anything else fails the batch."""
import ml_dtypes


def infer(inputs):
    x = inputs["x"]
    if x.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"x arrived as {x.dtype}, not bfloat16")
    return {"y": x * 2}
