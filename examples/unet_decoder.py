"""A 3D U-Net decoder accelerated with `cutlassfuse.fuse`.

    python examples/unet_decoder.py

Builds the decoder, fuses its ConvTranspose3d -> ReLU -> GroupNorm chains (two in
nn.Sequential blocks, one written in forward()), checks the outputs against the
original, times both, and trains both copies a few steps to the same loss.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.benchmarking import median_ms


def up_block(cin, cout, groups):
    return nn.Sequential(nn.ConvTranspose3d(cin, cout, 2, stride=2, bias=True), nn.ReLU(),
                         nn.GroupNorm(groups, cout), nn.Conv3d(cout, cout, 3, padding=1))


class UNetDecoder3d(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.up1 = up_block(4 * width, 2 * width, 8)
        self.up2 = up_block(4 * width, width, 8)
        self.final_up = nn.ConvTranspose3d(2 * width, width, 3, padding=1)
        self.final_norm = nn.GroupNorm(8, width)
        self.head = nn.Conv3d(width, 2, 1)

    def forward(self, bottleneck, skip1, skip2):
        x = torch.cat([self.up1(bottleneck), skip1], dim=1)
        x = torch.cat([self.up2(x), skip2], dim=1)
        x = self.final_norm(F.relu(self.final_up(x)))
        return self.head(x)


def main():
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    width, size, batch = (64, 12, 2) if cuda else (8, 3, 1)
    torch.manual_seed(0)
    eager = UNetDecoder3d(width).to(device, dtype)
    result = cutlassfuse.fuse(copy.deepcopy(eager))
    print(result)
    fused = result.model
    inputs = [torch.rand(batch, 4 * width, size, size, size, device=device, dtype=dtype),
              torch.rand(batch, 2 * width, 2 * size, 2 * size, 2 * size, device=device, dtype=dtype),
              torch.rand(batch, width, 4 * size, 4 * size, 4 * size, device=device, dtype=dtype)]
    with torch.no_grad():
        a, b = eager(*inputs), fused(*inputs)
        print(f"max |fused - eager| = {(a.float() - b.float()).abs().max().item():.3e}")
        for name, model in (("eager", eager), ("fused", fused)):
            ms = median_ms(lambda: model(*inputs), cuda=cuda, warmup=3, repeats=20 if cuda else 3)
            print(f"{name}: {ms:.3f} ms")

    target = torch.randn_like(a)
    for name, model in (("eager", eager), ("fused", fused)):
        model.float()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(10):
            optimizer.zero_grad()
            loss = F.mse_loss(model(*[t.float() for t in inputs]), target.float())
            loss.backward()
            optimizer.step()
        print(f"{name}: loss after 10 steps {loss.item():.6f}")


if __name__ == "__main__":
    main()
