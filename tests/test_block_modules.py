"""Conv3dNormActivation, ConvTranspose3dNormActivation and GroupNormActivation as drop-ins
for the torch.nn modules they hold: outputs in float64 on the CPU, state_dict keys and
loading, from_modules, the refused modules and arguments, extra_repr."""

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from cutlassfuse import Conv3dNormActivation, ConvTranspose3dNormActivation, GroupNormActivation

ACTIVATIONS = {
    "identity": dict(activation="identity"),
    "relu": dict(activation="relu"),
    "leaky_relu": dict(activation="leaky_relu"),
    "leaky_relu_0.2": dict(activation="leaky_relu", activation_parameter=0.2),
    "prelu": dict(activation="prelu"),
    "prelu_per_channel": dict(activation="prelu", prelu_parameters=8),
    "silu": dict(activation="silu"),
    "gelu": dict(activation="gelu"),
    "gelu_tanh": dict(activation="gelu_tanh"),
    "elu_0.7": dict(activation="elu", activation_parameter=0.7),
}
NORMS = {
    "instance": dict(norm="instance"),
    "instance_affine": dict(norm="instance", affine=True),
    "group": dict(norm="group", num_groups=4),
}
# The conv of each block class as the tests build it: in 4 channels, out 8.
CONV_BLOCKS = {
    "conv3d": (Conv3dNormActivation, dict(stride=(1, 2, 1), padding=1)),
    "conv_transpose3d": (ConvTranspose3dNormActivation, dict(stride=2, padding=1, output_padding=(1, 0, 1))),
}


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter drawn afresh (norm scales around 1, negative PReLU slopes too), so
    that none is left at a value that would hide its misuse."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale, offset = (0.3, 1.0) if name == "norm.weight" else (0.5, 0.0)
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale + offset)
    return module


def sequential(block: nn.Module) -> nn.Sequential:
    """The torch.nn modules of the block in the order it applies them."""
    if not hasattr(block, "conv"):
        return nn.Sequential(block.norm, block.activation)
    if block.activation_before_norm:
        return nn.Sequential(block.conv, block.activation, block.norm)
    return nn.Sequential(block.conv, block.norm, block.activation)


def rand_input(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("before", [False, True], ids=["after_norm", "before_norm"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kind", CONV_BLOCKS)
def test_conv_block_equals_its_modules(kind, activation, norm, before):
    cls, conv_options = CONV_BLOCKS[kind]
    block = randomize(cls(4, 8, 3, **conv_options, **NORMS[norm], **ACTIVATIONS[activation],
                          activation_before_norm=before, dtype=torch.float64))
    x = rand_input(2, 4, 4, 5, 3)
    torch.testing.assert_close(block(x), sequential(block)(x))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_norm_block_equals_its_modules(activation, affine):
    block = randomize(GroupNormActivation(4, 8, affine=affine, **ACTIVATIONS[activation], dtype=torch.float64))
    x = rand_input(2, 8, 3, 4, 5)
    torch.testing.assert_close(block(x), sequential(block)(x))


@pytest.mark.parametrize("affine", [True, False])
def test_norm_block_takes_instance_norm(affine):
    norm, activation = nn.InstanceNorm3d(8, affine=affine, dtype=torch.float64), nn.LeakyReLU(0.3)
    block = randomize(GroupNormActivation.from_modules(norm, activation))
    x = rand_input(2, 8, 3, 4, 5)
    torch.testing.assert_close(block(x), activation(norm(x)))


def test_every_conv_option_reaches_the_op():
    block = randomize(Conv3dNormActivation(6, 8, (3, 2, 4), stride=(2, 1, 2), padding=(1, 0, 2), dilation=(1, 2, 1),
                                           groups=2, bias=False, norm="group", num_groups=2, eps=1e-3,
                                           activation="elu", dtype=torch.float64))
    x = rand_input(2, 6, 5, 6, 7)
    torch.testing.assert_close(block(x), sequential(block)(x))
    assert list(block.state_dict()) == ["conv.weight", "norm.weight", "norm.bias"]


def test_every_conv_transpose_option_reaches_the_op():
    block = randomize(ConvTranspose3dNormActivation(6, 8, (3, 2, 4), stride=(2, 1, 3), padding=(1, 0, 2),
                                                    output_padding=(1, 0, 2), groups=2, bias=False, dilation=(1, 2, 1),
                                                    norm="instance", affine=True, eps=1e-3, activation="prelu",
                                                    prelu_parameters=8, activation_before_norm=True,
                                                    dtype=torch.float64))
    x = rand_input(2, 6, 3, 4, 5)
    torch.testing.assert_close(block(x), sequential(block)(x))


@pytest.mark.parametrize("output_size", [(10, 9, 8), [2, 8, 9, 10, 7]])
def test_output_size_picks_the_output_padding(output_size):
    """As nn.ConvTranspose3d.forward's output_size: (D, H, W), or a full shape."""
    block = randomize(ConvTranspose3dNormActivation(4, 8, 3, stride=2, padding=1, activation="silu",
                                                    dtype=torch.float64))
    x = rand_input(2, 4, 5, 5, 4)
    expected = block.activation(block.norm(block.conv(x, output_size=output_size)))
    torch.testing.assert_close(block(x, output_size=output_size), expected)


@pytest.mark.parametrize("kind", CONV_BLOCKS)
def test_gradients_equal_those_of_its_modules(kind):
    """Training through the block: the input's and every parameter's gradient."""
    cls, conv_options = CONV_BLOCKS[kind]
    block = randomize(cls(4, 8, 3, **conv_options, norm="group", num_groups=2, activation="prelu",
                          prelu_parameters=8, dtype=torch.float64))
    modules = sequential(copy.deepcopy(block))
    x = rand_input(2, 4, 4, 5, 3).requires_grad_()
    x_copy = x.detach().clone().requires_grad_()
    out = block(x)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out.backward(grad)
    modules(x_copy).backward(grad)
    torch.testing.assert_close(x.grad, x_copy.grad)
    for (name, p), q in zip(block.named_parameters(), modules.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def original_modules() -> nn.Sequential:
    """The three modules of a network as torch.nn builds them, named as the block's."""
    conv = nn.Conv3d(4, 8, 3, padding=1)
    norm = nn.GroupNorm(2, 8)
    activation = nn.PReLU(8)
    return nn.Sequential(OrderedDict(conv=conv, norm=norm, activation=activation))


def build_pair(seed: int) -> tuple[Conv3dNormActivation, nn.Sequential]:
    torch.manual_seed(seed)
    block = Conv3dNormActivation(4, 8, 3, padding=1, norm="group", num_groups=2, activation="prelu",
                                 prelu_parameters=8)
    torch.manual_seed(seed)
    return block, original_modules()


def test_state_dict_keys_and_same_seed_parameters_equal_the_modules():
    block, original = build_pair(seed=3)
    assert list(block.state_dict()) == ["conv.weight", "conv.bias", "norm.weight", "norm.bias", "activation.weight"]
    assert list(block.state_dict()) == list(original.state_dict())
    for (name, a), b in zip(block.state_dict().items(), original.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind", ["instance", "instance_affine", "group_no_affine"])
def test_state_dict_keys_of_other_norms(kind):
    options = {"instance": dict(), "instance_affine": dict(affine=True),
               "group_no_affine": dict(norm="group", num_groups=2, affine=False)}[kind]
    block = ConvTranspose3dNormActivation(4, 8, 2, bias=False, **options)
    expected = {"instance": ["conv.weight"], "instance_affine": ["conv.weight", "norm.weight", "norm.bias"],
                "group_no_affine": ["conv.weight"]}[kind]
    assert list(block.state_dict()) == expected


def test_norm_block_state_dict_keys():
    assert list(GroupNormActivation(2, 8, activation="prelu").state_dict()) == ["norm.weight", "norm.bias",
                                                                               "activation.weight"]
    assert list(GroupNormActivation(2, 8, affine=False).state_dict()) == []


def test_state_dicts_load_both_ways():
    block, _ = build_pair(seed=1)
    _, other = build_pair(seed=2)
    randomize(other)
    x = torch.rand(1, 4, 4, 4, 4)
    block.load_state_dict(other.state_dict())
    torch.testing.assert_close(block(x), other(x), rtol=1e-5, atol=1e-5)
    _, fresh = build_pair(seed=4)
    fresh.load_state_dict(randomize(block, seed=5).state_dict())
    torch.testing.assert_close(fresh(x), block(x), rtol=1e-5, atol=1e-5)


def test_from_modules_keeps_the_very_modules_and_parameters():
    conv, norm, activation = original_modules().eval()
    block = Conv3dNormActivation.from_modules(conv, norm, activation, activation_before_norm=True)
    assert block.conv is conv and block.norm is norm and block.activation is activation
    assert {id(p) for p in block.parameters()} == {id(p) for p in (conv.weight, conv.bias, norm.weight, norm.bias,
                                                                  activation.weight)}
    assert not block.training and block.activation_before_norm
    randomize(block)  # written through the block, seen by the modules
    x = torch.rand(2, 4, 3, 4, 5)
    torch.testing.assert_close(block(x), norm(activation(conv(x))), rtol=1e-5, atol=1e-5)


def test_norm_block_from_modules_keeps_the_very_modules():
    norm, activation = nn.GroupNorm(2, 8), nn.PReLU()
    block = GroupNormActivation.from_modules(norm, activation)
    assert block.norm is norm and block.activation is activation
    assert [id(p) for p in block.parameters()] == [id(norm.weight), id(norm.bias), id(activation.weight)]


def test_constructors_take_dtype_and_device():
    block = ConvTranspose3dNormActivation(4, 8, 3, norm="group", num_groups=2, activation="prelu", dtype=torch.float64,
                                          device="cpu")
    assert all(p.dtype == torch.float64 for p in block.parameters())
    assert block(rand_input(1, 4, 3, 3, 3)).dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in GroupNormActivation(2, 8, activation="prelu",
                                                                     dtype=torch.float64).parameters())


@pytest.mark.parametrize("padding, expected", [("same", (1, 2, 0)), ("valid", (0, 0, 0))])
def test_string_padding_resolves_to_explicit_padding(padding, expected):
    conv = nn.Conv3d(4, 8, (3, 5, 1), padding=padding, dtype=torch.float64)
    block = randomize(Conv3dNormActivation.from_modules(conv, nn.InstanceNorm3d(8), nn.ReLU()))
    x = rand_input(1, 4, 5, 6, 4)
    out = block(x)
    assert out.shape == conv(x).shape
    torch.testing.assert_close(out, sequential(block)(x))
    torch.testing.assert_close(out, torch.relu(block.norm(nn.functional.conv3d(x, conv.weight, conv.bias,
                                                                               padding=expected))))


def conv_norm_activation(conv: nn.Module | None = None, norm: nn.Module | None = None,
                         activation: nn.Module | None = None) -> tuple[nn.Module, nn.Module, nn.Module]:
    """Conv3d(4, 8, 3), GroupNorm(2, 8) and ReLU, but for the modules given."""
    return conv or nn.Conv3d(4, 8, 3), norm or nn.GroupNorm(2, 8), activation or nn.ReLU()


@pytest.mark.parametrize("modules, error, match", [
    (lambda: conv_norm_activation(conv=nn.Conv3d(4, 8, 3, padding=1, padding_mode="reflect")), ValueError,
     "padding_mode must be 'zeros', got 'reflect'"),
    (lambda: conv_norm_activation(conv=nn.Conv3d(4, 8, (3, 2, 3), padding="same")), ValueError,
     r"padding='same' with kernel_size=\(3, 2, 3\)"),
    (lambda: conv_norm_activation(norm=nn.GroupNorm(2, 6)), ValueError, "the norm has 6 channels, the conv gives 8"),
    (lambda: conv_norm_activation(norm=nn.InstanceNorm3d(8, track_running_stats=True)), ValueError,
     "track_running_stats"),
    (lambda: conv_norm_activation(activation=nn.ReLU6()), ValueError, "ReLU6"),
    (lambda: conv_norm_activation(activation=nn.PReLU(3)), ValueError,
     "PReLU has 3 parameters, must be 1 or the 8 channels"),
    (lambda: conv_norm_activation(conv=nn.ConvTranspose3d(4, 8, 3)), TypeError,
     "Conv3dNormActivation takes an nn.Conv3d, got ConvTranspose3d"),
    (lambda: conv_norm_activation(norm=nn.BatchNorm3d(8)), TypeError,
     "norm must be an nn.GroupNorm or an nn.InstanceNorm3d, got BatchNorm3d"),
], ids=["padding_mode", "uneven_same", "channels", "running_stats", "relu6", "prelu_count", "conv_type", "norm_type"])
def test_from_modules_refuses_what_the_op_does_not_compute(modules, error, match):
    with pytest.raises(error, match=match):
        Conv3dNormActivation.from_modules(*modules())


def test_conv_transpose_from_modules_refuses_a_conv3d():
    with pytest.raises(TypeError, match="takes an nn.ConvTranspose3d, got Conv3d"):
        ConvTranspose3dNormActivation.from_modules(*conv_norm_activation())


@pytest.mark.parametrize("modules, error, match", [
    (lambda: (nn.InstanceNorm3d(8, track_running_stats=True), nn.ReLU()), ValueError, "track_running_stats"),
    (lambda: (nn.BatchNorm3d(8), nn.ReLU()), TypeError, "nn.GroupNorm or an nn.InstanceNorm3d"),
    (lambda: (nn.GroupNorm(2, 8), nn.Hardswish()), ValueError, "Hardswish"),
    (lambda: (nn.GroupNorm(2, 8), nn.PReLU(4)), ValueError, "PReLU has 4 parameters, must be 1 or the 8 channels"),
], ids=["running_stats", "norm_type", "hardswish", "prelu_count"])
def test_norm_block_from_modules_refuses_what_the_op_does_not_compute(modules, error, match):
    with pytest.raises(error, match=match):
        GroupNormActivation.from_modules(*modules())


@pytest.mark.parametrize("options, match", [
    (dict(norm="batch"), "norm must be 'group' or 'instance', got 'batch'"),
    (dict(norm="group"), "norm='group' needs num_groups"),
    (dict(num_groups=2), "norm='instance' .* takes no num_groups, got 2"),
    (dict(activation="relu6"), "activation must be one of identity, relu, .*; got 'relu6'"),
    (dict(activation="relu", activation_parameter=0.1), "activation='relu' takes no activation_parameter"),
    (dict(activation="prelu", prelu_parameters=3), "prelu_parameters must be 1 or the 8 channels, got 3"),
    (dict(activation="relu", prelu_parameters=8), "prelu_parameters applies to activation='prelu'"),
], ids=["norm", "num_groups_missing", "num_groups_instance", "activation", "parameter", "prelu_count", "prelu_relu"])
def test_constructor_refuses_bad_arguments(options, match):
    with pytest.raises(ValueError, match=match):
        Conv3dNormActivation(4, 8, 3, **options)


def test_activation_parameter_defaults_and_prelu_init():
    assert Conv3dNormActivation(4, 8, 3, activation="leaky_relu").activation.negative_slope == 0.01
    assert Conv3dNormActivation(4, 8, 3, activation="elu").activation.alpha == 1.0
    prelu = ConvTranspose3dNormActivation(4, 8, 3, activation="prelu", activation_parameter=0.1,
                                          prelu_parameters=8).activation
    assert prelu.num_parameters == 8 and torch.equal(prelu.weight, torch.full((8,), 0.1))
    assert GroupNormActivation(2, 8, activation="gelu_tanh").activation.approximate == "tanh"


def test_repr_shows_the_constructor_arguments():
    """Defaults left out, as the torch.nn modules print theirs."""
    plain = Conv3dNormActivation(16, 32, 3)
    assert plain.extra_repr() == ("16, 32, kernel_size=(3, 3, 3), stride=(1, 1, 1), norm='instance', eps=1e-05, "
                                  "affine=False, activation='relu'")
    every = Conv3dNormActivation(16, 32, (3, 2, 3), stride=2, padding=1, dilation=(1, 2, 1), groups=2, bias=False,
                                 norm="group", num_groups=8, eps=1e-3, activation="leaky_relu",
                                 activation_parameter=0.1, activation_before_norm=True)
    assert every.extra_repr() == ("16, 32, kernel_size=(3, 2, 3), stride=(2, 2, 2), padding=(1, 1, 1), "
                                  "dilation=(1, 2, 1), groups=2, bias=False, norm='group', num_groups=8, eps=0.001, "
                                  "affine=True, activation='leaky_relu', activation_parameter=0.1, "
                                  "activation_before_norm=True")
    assert repr(every).startswith(f"Conv3dNormActivation(\n  {every.extra_repr()}\n  (conv): Conv3d(")
    transposed = ConvTranspose3dNormActivation(16, 32, 3, stride=2, padding=1, output_padding=1, affine=True,
                                               activation="prelu", prelu_parameters=32)
    assert transposed.extra_repr() == ("16, 32, kernel_size=(3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1), "
                                       "output_padding=(1, 1, 1), norm='instance', eps=1e-05, affine=True, "
                                       "activation='prelu', prelu_parameters=32")
    same = Conv3dNormActivation.from_modules(nn.Conv3d(16, 32, 3, padding="same"), nn.InstanceNorm3d(32), nn.SiLU())
    assert same.extra_repr().startswith("16, 32, kernel_size=(3, 3, 3), stride=(1, 1, 1), padding='same', norm=")
    assert GroupNormActivation(8, 32, activation="elu").extra_repr() == (
        "8, 32, eps=1e-05, affine=True, activation='elu', activation_parameter=1.0")
    instance = GroupNormActivation.from_modules(nn.InstanceNorm3d(32), nn.Identity())
    assert instance.extra_repr() == "32, 32, eps=1e-05, affine=False, activation='identity'"


def test_parametrized_parameters_are_read_as_their_attribute():
    """A parameter under torch.nn.utils.parametrize is computed on every read; the block
    reads it as the attribute it became, not the stored original."""

    class Doubled(nn.Module):
        def forward(self, tensor):
            return 2 * tensor

    conv = nn.Conv3d(4, 8, 3, padding=1, dtype=torch.float64)
    norm = nn.GroupNorm(2, 8, dtype=torch.float64)
    with torch.no_grad():
        norm.bias.uniform_(-1, 1)
    parametrize.register_parametrization(conv, "weight", Doubled())
    parametrize.register_parametrization(norm, "bias", Doubled())
    act = nn.PReLU(dtype=torch.float64)
    parametrize.register_parametrization(act, "weight", Doubled())
    block = Conv3dNormActivation.from_modules(conv, norm, act)
    x = torch.randn(2, 4, 5, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(block(x), act(norm(conv(x))))
    standalone = GroupNormActivation.from_modules(norm, act)
    torch.testing.assert_close(standalone(x[:, :2].repeat(1, 4, 1, 1, 1)), act(norm(x[:, :2].repeat(1, 4, 1, 1, 1))))
