"""KernelBench level2/61 with cutlassfuse: `ModelNew` is the drop-in for `Model`.

    python examples/kernelbench_61.py

Same constructor, same state_dict, same parameters for the same seed; in float32 (the
default float32 mode) and float16, prints KernelBench's allclose check against Model, the
error of both against float64 and their times (float32 at a reduced size on the CPU
without a GPU).
"""

import torch
import torch.nn as nn

import cutlassfuse
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.testing import errors, reference_float64

batch_size, in_channels, out_channels, D, H, W, kernel_size, groups = 16, 64, 128, 32, 32, 32, 3, 8


class Model(nn.Module):
    """KernelBench's reference: ConvTranspose3d, ReLU, GroupNorm."""

    def __init__(self, in_channels, out_channels, kernel_size, groups, bias=False):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, bias=bias)
        self.relu = nn.ReLU()
        self.group_norm = nn.GroupNorm(num_groups=groups, num_channels=out_channels)

    def forward(self, x):
        return self.group_norm(self.relu(self.conv_transpose(x)))


class ModelNew(cutlassfuse.ConvTranspose3dReLUGroupNorm):
    """The same block as one fused op."""


def get_inputs(device="cpu", dtype=torch.float32):
    return [torch.rand(batch_size, in_channels, D, H, W, device=device, dtype=dtype)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]


def main():
    global batch_size, D, H, W
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtypes = (torch.float32, torch.float16) if cuda else (torch.float32,)
    if not cuda:
        batch_size, D, H, W = 2, 8, 8, 8
        print("no CUDA device: reduced size on the CPU")
    for dtype in dtypes:
        torch.manual_seed(0)
        model = Model(*get_init_inputs()).to(device, dtype)
        torch.manual_seed(0)
        model_new = ModelNew(*get_init_inputs()).to(device, dtype)
        assert list(model.state_dict()) == list(model_new.state_dict())
        (x,) = get_inputs(device, dtype)
        with torch.no_grad():
            conv, norm = model_new.conv_transpose, model_new.group_norm
            reference = reference_float64(x, conv.weight, num_groups=norm.num_groups, norm_weight=norm.weight,
                                          norm_bias=norm.bias)
            # KernelBench's correctness check: allclose to Model, 1e-4 in float32 (float32 mode
            # "pytorch", the default, runs Model's own convolution), 1e-2 in float16.
            tolerance = 1e-4 if dtype == torch.float32 else 1e-2
            matches = torch.allclose(model_new(x), model(x), atol=tolerance, rtol=tolerance)
            print(f"{str(dtype)[6:]}: allclose(ModelNew, Model, {tolerance:g}) = {matches}")
            for name, m in (("Model", model), ("ModelNew", model_new)):
                ms = median_ms(lambda: m(x), cuda=cuda, warmup=5 if cuda else 1, repeats=30 if cuda else 3)
                print(f"  {name:9s} {errors(m(x), reference)}   {ms:.3f} ms")


if __name__ == "__main__":
    main()
