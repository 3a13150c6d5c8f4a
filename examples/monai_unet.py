"""A MONAI network accelerated with `cutlassfuse.fuse`: load its checkpoint, fuse, run.

    python examples/monai_unet.py [--network basicunet|segresnet|attentionunet] [--checkpoint model.pt]
                                  [--channels-last] [--cuda-graphs]

Builds one of MONAI's 3D segmentation networks, loads its checkpoint (a state_dict saved
from the MONAI model; without one the weights stay as initialized), puts it in eval mode
and fuses a copy: its conv -> InstanceNorm3d/GroupNorm -> activation chains and norm ->
activation pairs become cutlassfuse blocks, its conv -> BatchNorm3d pairs (AttentionUnet's)
fold into the convolution. Prints fuse()'s report, then runs both models under
torch.no_grad(), on a GPU in float16 on a 128^3 volume, on the CPU in float32 on a 32^3
one: the largest difference between their outputs, and their times. ``--channels-last``
runs both in channels_last_3d (the blocks keep it: their outputs are channels-last too);
``--cuda-graphs`` has the fused model replay its forward from CUDA graphs
(``fuse(..., cuda_graphs=True)``; on the CPU it runs as it is).
"""

import argparse
import copy

import torch

import cutlassfuse
from cutlassfuse.benchmarking import print_fused_against_eager

try:
    from monai.networks import nets
except ImportError as error:
    raise SystemExit(f"monai_unet.py needs MONAI (pip install monai): {error}") from error

NETWORKS = {
    "basicunet": lambda: nets.BasicUNet(spatial_dims=3, in_channels=1, out_channels=2),
    "segresnet": lambda: nets.SegResNet(spatial_dims=3, init_filters=16, in_channels=1, out_channels=2),
    "attentionunet": lambda: nets.AttentionUnet(spatial_dims=3, in_channels=1, out_channels=2,
                                                channels=(16, 32, 64, 128), strides=(2, 2, 2)),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=NETWORKS, default="basicunet")
    parser.add_argument("--checkpoint", help="a state_dict saved from the MONAI network (torch.save)")
    parser.add_argument("--channels-last", action="store_true", help="model and input in channels_last_3d")
    parser.add_argument("--cuda-graphs", action="store_true", help="the fused model replays CUDA graphs of its forward")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda: float16 at 128^3; cpu: float32 at 32^3")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    device, dtype, size = ("cuda", torch.float16, 128) if cuda else ("cpu", torch.float32, 32)
    layout = torch.channels_last_3d if args.channels_last else torch.contiguous_format

    torch.manual_seed(0)
    model = NETWORKS[args.network]()
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, weights_only=True))
    model.eval()  # BatchNorm3d folds in eval mode only
    result = cutlassfuse.fuse(copy.deepcopy(model), cuda_graphs=args.cuda_graphs)
    print(result)

    eager = model.to(device, dtype, memory_format=layout)
    fused = result.model.to(device, dtype, memory_format=layout)
    x = torch.rand(1, 1, size, size, size).to(device, dtype, memory_format=layout)
    print_fused_against_eager(eager, fused, x, f"{dtype}, {'channels_last_3d' if args.channels_last else 'NCDHW'}")


if __name__ == "__main__":
    main()
