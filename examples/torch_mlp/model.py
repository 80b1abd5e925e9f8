"""A PyTorch network served by sheaf's Python backend through the batched API: the MLP
512-2048-2048-10 of the ONNX demo, its weights drawn from a fixed seed, run on the device that
sheaf gives the instance (`config["device"]`: `cuda:0` where the server's devices say so, else
`cpu`). sheaf has already concatenated the batch's requests along the first axis; the answer is
sliced back to each request."""
import numpy as np
import torch

net = None
device = None


def build(seed=0):
    """The network with its fixed weights, on the CPU (the same on every machine)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).eval()


def load(config):
    global net, device
    device = torch.device(config.get("device", "cpu"))
    # Full float32 products, so that answers agree with the CPU's to about 1e-5.
    torch.backends.cuda.matmul.allow_tf32 = False
    net = build().to(device)


@torch.inference_mode()
def infer(inputs):
    x = torch.from_numpy(inputs["input"]).to(device, non_blocking=True)
    y = net(x)
    on_gpu = np.full((x.shape[0], 1), int(y.is_cuda), dtype=np.int32)
    return {"output": y.cpu().numpy(), "on_gpu": on_gpu}
