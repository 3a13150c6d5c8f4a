"""The invalid-call matrix: calls a user can get wrong, each with the exception it must
raise. `python tests/invalid_calls.py CASE DEVICE` makes one call in a process of its
own (a crash then fails that case, not the test run), then a valid call in the same
process, and prints what happened as one JSON line (tests/test_invalid_calls.py).

Every call starts from one valid call: input (2, 16, 6, 6, 6), weight (16, 32, 3, 3, 3),
8 groups, float16 on CUDA and float32 on the CPU; a case changes one thing.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import torch

TENSOR_ARGUMENTS = ("weight", "bias", "norm_weight", "norm_bias", "packed_weight", "packed_bias")


@dataclass(frozen=True)
class Case:
    name: str
    change: dict = field(default_factory=dict)  # argument -> value, or a callable of the valid call's arguments
    error: type[Exception] | None = None  # None: the call is valid and must match the reference
    match: str = ""


def _tensor(shape, dtype=None):
    return lambda args: torch.ones(shape, dtype=dtype or args["input"].dtype, device=args["input"].device)


def _convert(name, **to):
    return lambda args: args[name].to(**to)


ALL_META = {name: _convert(name, device="meta") for name in ("input", *TENSOR_ARGUMENTS)}

CASES = [
    Case("num_groups_not_dividing", {"num_groups": 5}, ValueError, r"num_groups \(5\) must be positive and divide"),
    Case("num_groups_zero", {"num_groups": 0}, ValueError, r"num_groups \(0\)"),
    Case("num_groups_negative", {"num_groups": -8}, ValueError, r"num_groups \(-8\)"),
    Case("num_groups_above_channels", {"num_groups": 64}, ValueError, r"num_groups \(64\)"),
    Case("input_4d", {"input": lambda a: a["input"][0]}, ValueError, "input must be 5-D"),
    Case("weight_4d", {"weight": lambda a: a["weight"][0]}, ValueError, "weight must be 5-D"),
    Case("weight_in_channels", {"weight": lambda a: a["weight"][:8]}, ValueError, r"weight.shape\[0\] \(8\)"),
    Case("zero_in_channels", {"input": lambda a: a["input"][:, :0], "weight": lambda a: a["weight"][:0]},
         ValueError, "only the batch"),
    Case("zero_depth", {"input": lambda a: a["input"][:, :, :0]}, ValueError, "only the batch"),
    Case("zero_out_channels", {"weight": lambda a: a["weight"][:, :0]}, ValueError, "zero output channels"),
    Case("padding_negative", {"padding": -1}, ValueError, "padding must be non-negative"),
    Case("stride_zero", {"stride": 0}, ValueError, "stride must be positive"),
    Case("dilation_zero", {"dilation": 0}, ValueError, "dilation must be positive"),
    Case("output_padding_too_large", {"stride": 2, "output_padding": 5}, ValueError,
         "output_padding must be smaller"),
    Case("output_padding_negative", {"output_padding": -1}, ValueError, "output_padding must be smaller"),
    Case("output_empty", {"padding": 20}, ValueError, "output would be empty"),
    Case("conv_groups_zero", {"groups": 0}, ValueError, "groups must be positive"),
    Case("conv_groups_not_dividing", {"groups": 3}, ValueError, "divisible by groups"),
    Case("stride_two_values", {"stride": (1, 2)}, ValueError, "stride must be an int or 3 ints"),
    Case("padding_four_values", {"padding": (1, 1, 1, 1)}, ValueError, "padding must be an int or 3 ints"),
    Case("dilation_one_value_list", {"dilation": [1]}, ValueError, "dilation must be an int or 3 ints"),
    Case("norm_weight_length", {"norm_weight": _tensor(7)}, ValueError, r"norm_weight must have shape \(32,\)"),
    Case("norm_bias_2d", {"norm_bias": _tensor((32, 1))}, ValueError, r"norm_bias must have shape \(32,\)"),
    Case("bias_length", {"bias": _tensor(5)}, ValueError, r"bias must have shape \(32,\)"),
    Case("bias_float64", {"bias": _tensor(32, torch.float64)}, TypeError, "bias must have the input's dtype"),
    Case("norm_weight_integer", {"norm_weight": _tensor(32, torch.int32)}, TypeError,
         "norm_weight must be a floating-point tensor"),
    Case("weight_dtype", {"weight": _convert("weight", dtype=torch.float64)}, TypeError, "weight dtype"),
    Case("integer_dtype", {name: _convert(name, dtype=torch.int32) for name in ("input", "weight")},
         TypeError, "input must be a floating-point tensor"),
    Case("complex_dtype", {name: _convert(name, dtype=torch.complex64) for name in ("input", "weight")},
         TypeError, "input must be a floating-point tensor"),
    Case("eps_negative", {"eps": -1.0}, ValueError, "eps must be finite and non-negative"),
    Case("eps_nan", {"eps": float("nan")}, ValueError, "eps must be finite and non-negative"),
    Case("eps_inf", {"eps": float("inf")}, ValueError, "eps must be finite and non-negative"),
    Case("packed_weight_shape", {"packed_weight": lambda a: a["weight"]}, ValueError,
         r"packed_weight must be weight.permute\(0, 2, 3, 4, 1\)"),
    Case("packed_weight_dtype", {"packed_weight": lambda a: a["weight"].permute(0, 2, 3, 4, 1).double()}, TypeError,
         "packed_weight must have the weight's dtype"),
    Case("packed_bias_without_bias", {"bias": None, "packed_bias": _tensor(32)}, ValueError,
         "packed_bias given without a bias"),
    Case("packed_bias_length", {"bias": _tensor(32), "stride": 2, "packed_bias": _tensor(32)}, ValueError,
         r"bias.repeat\(prod\(stride\)\), 256"),
    # Outputs beyond PyTorch's limit on a tensor's storage (2^63 - 1 bytes), refused before
    # anything is allocated: more elements than int64 counts; elements that int64 counts but
    # bytes it does not (8.0e18 elements); an extent past int64 itself (stride or dilation
    # 2^62); the same on meta tensors (the fake kernel).
    Case("stride_2_31", {"stride": 2**31}, ValueError, r"output size overflows: .*stride \[2147483648, "),
    Case("output_bytes_overflow", {"stride": 100_000}, ValueError, "output size overflows"),
    Case("stride_extent_overflow", {"stride": 2**62}, ValueError, "output size overflows"),
    Case("dilation_extent_overflow", {"dilation": 2**62}, ValueError, "output size overflows"),
    Case("all_meta_stride_2_31", {**ALL_META, "stride": 2**31}, ValueError, "output size overflows"),
    # Sizes computed exactly: padding 2^63 - 1 empties the output (int64 arithmetic would wrap).
    Case("padding_int64_max", {"padding": 2**63 - 1}, ValueError, "output would be empty"),
    Case("stride_beyond_int64", {"stride": 2**63}, ValueError, "stride must lie within int64's range"),
    # Valid calls at the edges, computed as PyTorch computes them.
    Case("float64", {name: _convert(name, dtype=torch.float64) for name in ("input", "weight", "bias")}),
    Case("zero_batch", {"input": lambda a: a["input"][:0]}),
    Case("all_meta", ALL_META),
]


def device_mix_cases(device: str) -> list[Case]:
    """Each tensor argument, then the input, on every other device this process has:
    PyTorch's kind of device-mismatch error (RuntimeError)."""
    others = [d for d in ("cpu", "cuda", "meta") if d != device and (d != "cuda" or torch.cuda.is_available())]
    cases = []
    for other in others:
        for name in (*TENSOR_ARGUMENTS, "input"):
            change = {name: _convert(name, device=other)}
            if name == "packed_bias":
                change["bias"] = lambda a: a["bias"]  # present, on the call's device
            cases.append(Case(f"{name}_on_{other}", change, RuntimeError,
                              "expected all tensors to be on the same device"))
    return cases


def cases_for(device: str) -> list[Case]:
    return CASES + device_mix_cases(device)


def valid_arguments(device: str, seed: int = 0) -> dict:
    """The valid call every case starts from, with every optional tensor given (the
    packed operands the module passes included) so that each can be made wrong."""
    from cutlassfuse.testing import make_inputs, packed_operands

    args = make_inputs(batch=2, in_channels=16, out_channels=32, size=6, kernel=3, num_groups=8,
                       dtype=torch.float16 if device == "cuda" else torch.float32, device=device, seed=seed)
    return dict(args, **packed_operands(args))


def call(args: dict) -> torch.Tensor:
    """The op with these arguments, as the functional op and the module pass them."""
    from cutlassfuse.testing import op_arguments

    return torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*op_arguments(args))


def apply(case: Case, device: str) -> dict:
    """The valid call with the case's change; packed copies of a changed weight, bias or
    stride are dropped unless the case sets them."""
    args = valid_arguments(device)
    changed = {name: value(args) if callable(value) else value for name, value in case.change.items()}
    for packed, sources in (("packed_weight", ("weight",)), ("packed_bias", ("bias", "stride"))):
        if packed not in changed and any(source in changed for source in sources):
            args[packed] = None
    args.update(changed)
    return args


def _check_against_reference(out: torch.Tensor, args: dict) -> str:
    """'' when `out` matches the float64 composite: shape, dtype, device and, where there
    is data, values."""
    from cutlassfuse.testing import RELATIVE_TOLERANCE, errors, reference_float64

    x, weight = args["input"], args["weight"]
    reference_args = {k: v for k, v in args.items() if k not in ("packed_weight", "packed_bias")}
    on_meta = x.device.type == "meta"
    ref = torch.empty(0) if on_meta else reference_float64(**reference_args)
    shape = (x.shape[0], weight.shape[1] * args["groups"], 8, 8, 8) if on_meta else tuple(ref.shape)
    if tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        return f"output {tuple(out.shape)} {out.dtype} {out.device}, expected {shape} {x.dtype} {x.device}"
    if on_meta or out.numel() == 0:
        return ""
    error = errors(out, ref)
    tolerance = 10 * RELATIVE_TOLERANCE[out.dtype]
    return "" if error.relative <= tolerance else f"{error} above {tolerance:.0e}"


def run(name: str, device: str) -> dict:
    """The case's call, then a valid call in the same process: what each gave."""
    case = next(c for c in cases_for(device) if c.name == name)
    args = apply(case, device)
    result: dict = {"case": name, "device": device}
    try:
        out = call(args)
        if device == "cuda":
            torch.cuda.synchronize()
        result.update(raised=None, mismatch=_check_against_reference(out, args))
    except Exception as error:  # noqa: BLE001  (reported to the parent test)
        result.update(raised=type(error).__name__, message=str(error).splitlines()[0])
    valid = valid_arguments(device, seed=1)
    result["next_valid_call"] = _check_against_reference(call(valid), valid)
    return result


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
