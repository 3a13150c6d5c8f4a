"""cutlassfuse.fuse on Sequential chains, traced forward() code, and a decoder-style
model: same outputs, same parameter objects, and an honest report."""

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse import ConvTranspose3dReLUGroupNorm

from fuse_checks import assert_checkpoints_load_both_ways, randomized


def up_block(cin, cout, groups):
    return nn.Sequential(nn.ConvTranspose3d(cin, cout, 2, stride=2, bias=True), nn.ReLU(),
                         nn.GroupNorm(groups, cout), nn.Conv3d(cout, cout, 3, padding=1))


class UNetDecoder3d(nn.Module):
    """Decoder of a 3D U-Net: upsampling blocks, skip connections, a head; one more
    upsampling chain written in forward() code rather than in a Sequential."""

    def __init__(self):
        super().__init__()
        self.up1 = up_block(32, 16, 4)
        self.up2 = up_block(32, 8, 2)
        self.final_up = nn.ConvTranspose3d(16, 8, 3, padding=1)
        self.final_norm = nn.GroupNorm(4, 8)
        self.head = nn.Conv3d(8, 2, 1)

    def forward(self, bottleneck, skip1, skip2):
        x = torch.cat([self.up1(bottleneck), skip1], dim=1)
        x = torch.cat([self.up2(x), skip2], dim=1)
        x = self.final_norm(F.relu(self.final_up(x)))
        return self.head(x)


def decoder_inputs():
    return torch.rand(2, 32, 2, 2, 2), torch.rand(2, 16, 4, 4, 4), torch.rand(2, 8, 8, 8, 8)


def test_decoder_every_chain_fused_same_outputs_same_parameters():
    torch.manual_seed(0)
    model = UNetDecoder3d().eval()
    inputs = decoder_inputs()
    expected = model(*inputs)
    parameters = {id(p) for p in model.parameters()}

    result = cutlassfuse.fuse(model)
    assert len(result.replaced) == 3, str(result)
    assert result.not_traced is None
    fused_blocks = [m for m in result.model.modules() if isinstance(m, ConvTranspose3dReLUGroupNorm)]
    assert len(fused_blocks) == 3
    assert {id(p) for p in result.model.parameters()} == parameters, "parameters must be reused, not copied"
    torch.testing.assert_close(result.model(*inputs), expected, rtol=1e-5, atol=1e-5)
    assert "final_up" in str(result) and "up1.0" in str(result)


def test_sequential_rewrite_keeps_the_keys_and_type():
    torch.manual_seed(0)
    model = up_block(8, 8, 2)
    keys = list(model.state_dict())
    x = torch.rand(1, 8, 3, 3, 3)
    expected = model(x)
    result = cutlassfuse.fuse(model, trace=False)
    assert result.model is model and isinstance(model, nn.Sequential)
    assert isinstance(model[0], ConvTranspose3dReLUGroupNorm) and isinstance(model[1], nn.Identity)
    assert list(model.state_dict()) == keys == ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    assert "0.conv_transpose.weight" in dict(model.named_parameters()), "the module structure is the fused one"
    torch.testing.assert_close(model(x), expected)


class UpNorm(nn.Module):
    """A conv and a GroupNorm for forward() code to chain (or not)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 4, 2)
        self.norm = nn.GroupNorm(2, 4)


def test_chain_with_shared_intermediate_is_left_alone():
    class Branching(UpNorm):
        def forward(self, x):
            y = F.relu(self.up(x))
            return self.norm(y) + y  # the ReLU output is needed by two consumers

    result = cutlassfuse.fuse(Branching())
    assert result.replaced == []


def test_untraceable_forward_is_reported_and_sequentials_still_fused():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = up_block(4, 4, 2)

        def forward(self, x):
            return self.block(x) if x.sum() > 0 else x

    model = DataDependent()
    result = cutlassfuse.fuse(model)
    assert result.model is model and len(result.replaced) == 1
    assert result.not_traced is not None


def test_forward_branching_on_train_mode_is_not_traced():
    """A trace would freeze the branch of the mode the model was in; eval() must still
    take the other one afterwards."""

    class TrainOnlyShift(UpNorm):
        def __init__(self):
            super().__init__()
            self.block = up_block(4, 4, 2)

        def forward(self, x):
            y = self.norm(F.relu(self.up(self.block(x))))
            return y + 1 if self.training else y

    torch.manual_seed(0)
    model = TrainOnlyShift().train()
    x = torch.rand(1, 4, 2, 2, 2)
    result = cutlassfuse.fuse(model)
    assert result.model is model and len(result.replaced) == 1  # the Sequential chain only
    assert "train and eval mode" in result.not_traced
    assert model.training and all(m.training for m in model.modules())
    torch.testing.assert_close(model.train()(x) - model.eval()(x), torch.ones(1, 4, 5, 5, 5))


def test_fusing_keeps_each_module_mode():
    """Tracing in both modes restores every module's own flag, and the modules put in
    place (fused blocks, Identity) take the mode of the layers they replace."""
    model = UNetDecoder3d().train()
    model.up1.eval()  # e.g. a frozen part of a model being fine-tuned
    modes = {module: module.training for module in model.modules()}
    result = cutlassfuse.fuse(model)
    assert result.not_traced is None and len(result.replaced) == 3
    assert all(module.training == training for module, training in modes.items())
    fused_modes = {name: m.training for name, m in result.model.named_modules()}
    assert fused_modes[""] and fused_modes["up2.0"] and fused_modes["final_up_relu_final_norm"]
    # ("up1" itself is a container torch.fx makes anew; the modules it holds run.)
    assert not any(training for name, training in fused_modes.items() if name.startswith("up1."))


def test_only_conv_transpose3d_relu_group_norm_takes_the_original_block():
    """LeakyReLU makes it a block of the family; a 2-D conv is no chain at all."""
    model = nn.Sequential(nn.ConvTranspose3d(4, 4, 2, padding_mode="zeros"), nn.LeakyReLU(), nn.GroupNorm(2, 4),
                          nn.ConvTranspose3d(4, 8, 2), nn.ReLU(), nn.GroupNorm(2, 4 * 2), nn.ConvTranspose2d(8, 8, 2),
                          nn.ReLU(), nn.GroupNorm(2, 8))
    result = cutlassfuse.fuse(model, trace=False)
    assert [line.split(" -> ")[-1] for line in result.replaced] == ["ConvTranspose3dNormActivation",
                                                                   "ConvTranspose3dReLUGroupNorm"]
    assert result.replaced[1].startswith("3:") and type(model[6]) is nn.ConvTranspose2d


class SkipSizedUp(nn.Module):
    """A U-Net step that sizes the upsampling by the skip connection (output_size), in
    the three ways forward() code passes it."""

    def __init__(self, call: str):
        super().__init__()
        self.call = call
        self.up = nn.ConvTranspose3d(8, 8, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x, skip):
        if self.call == "keyword":
            y = self.up(x, output_size=skip.shape[2:])
        elif self.call == "positional":
            y = self.up(x, skip.shape)
        else:
            y = self.up(input=x)
        return self.norm(F.relu(y))


@pytest.mark.parametrize("call", ["keyword", "positional", "input_keyword"])
def test_conv_call_arguments_reach_the_fused_block(call):
    torch.manual_seed(0)
    model = SkipSizedUp(call)
    x, skip = torch.rand(2, 8, 4, 4, 4), torch.rand(2, 8, 8, 8, 8)
    expected = model(x, skip)
    result = cutlassfuse.fuse(model)
    assert len(result.replaced) == 1
    out = result.model(x, skip)
    assert out.shape == expected.shape == ((2, 8, 7, 7, 7) if call == "input_keyword" else skip.shape)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_conv_call_with_other_arguments_is_left_alone():
    class Unusual(UpNorm):
        def forward(self, x):
            return self.norm(F.relu(self.up(x, None, extra=1)))  # not a ConvTranspose3d call this block can take

    assert cutlassfuse.fuse(Unusual()).replaced == []


def test_one_conv_feeding_two_chains_keeps_each_norm():
    class SharedConv(UpNorm):
        def __init__(self):
            super().__init__()
            self.other_norm = nn.GroupNorm(4, 4)
            nn.init.normal_(self.other_norm.weight)

        def forward(self, x, y):
            return self.norm(F.relu(self.up(x))) + self.other_norm(F.relu(self.up(y)))

    torch.manual_seed(0)
    model = SharedConv()
    x, y = torch.rand(2, 4, 3, 3, 3), torch.rand(2, 4, 3, 3, 3)
    expected = model(x, y)
    result = cutlassfuse.fuse(model)
    assert len(result.replaced) == 2
    torch.testing.assert_close(result.model(x, y), expected, rtol=1e-5, atol=1e-5)


class NestedSequential(nn.Module):
    """A Sequential chain two levels down, between other layers."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Conv3d(4, 8, 1)
        self.decoder = nn.ModuleDict({"up": up_block(8, 8, 2)})

    def forward(self, x):
        return self.decoder["up"](self.encoder(x))


class ChainInCode(nn.Module):
    """A chain written in forward() code, between other layers."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv3d(4, 8, 1)
        self.up = nn.ConvTranspose3d(8, 8, 2, stride=2)
        self.norm = nn.GroupNorm(2, 8)
        self.head = nn.Conv3d(8, 2, 1)

    def forward(self, x):
        return self.head(self.norm(F.relu(self.up(self.stem(x)))))


class ConvAlsoCalledAlone(ChainInCode):
    """The chain's conv also called outside the chain: the traced model keeps it."""

    def forward(self, x):
        y = self.stem(x)
        return self.head(self.norm(F.relu(self.up(y))) + self.up(y))


class TwoChainsOneConv(UpNorm):
    """One conv feeding two chains: two fused blocks hold its parameters."""

    def __init__(self):
        super().__init__()
        self.other_norm = nn.GroupNorm(4, 4)

    def forward(self, x):
        return self.norm(F.relu(self.up(x))) + self.other_norm(F.relu(self.up(x * 2)))


class ContainersAroundBlocks(nn.Module):
    """MONAI's layout: each conv in a container with a nested one of norm, dropout with p=0
    and activation, and nn.Identity between them."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv3d(4, 8, 3, padding=1),
                                  nn.Sequential(nn.InstanceNorm3d(8, affine=True), nn.Dropout(0.0), nn.PReLU()))
        self.skip = nn.Identity()
        self.up = nn.Sequential(nn.ConvTranspose3d(8, 4, 2, stride=2),
                                nn.Sequential(nn.GroupNorm(2, 4), nn.Dropout3d(0.0), nn.SiLU()))

    def forward(self, x):
        return self.up(self.skip(self.down(x)))


def called_modules(graph_module: torch.fx.GraphModule) -> list[nn.Module]:
    return [graph_module.get_submodule(node.target) for node in graph_module.graph.nodes if node.op == "call_module"]


def test_containers_around_fused_blocks_leave_the_traced_model():
    """Chains the Sequential rewrite fused inside a traceable model: the trace runs in its
    place and calls the two blocks alone, neither their containers nor the calls that
    return their input; outputs and checkpoint keys are the original model's."""
    original = randomized(ContainersAroundBlocks().double(), seed=0)
    x = torch.rand(2, 4, 3, 3, 3, dtype=torch.float64)
    result = cutlassfuse.fuse(copy.deepcopy(original))
    assert isinstance(result.model, torch.fx.GraphModule) and len(result.replaced) == 2, str(result)
    assert [type(module) for module in called_modules(result.model)] == [
        cutlassfuse.Conv3dNormActivation, cutlassfuse.ConvTranspose3dNormActivation]
    torch.testing.assert_close(result.model(x), original(x))
    assert_checkpoints_load_both_ways(ContainersAroundBlocks, (torch.rand(2, 4, 3, 3, 3),))


def test_a_plain_sequential_model_keeps_its_type_and_indexing():
    model = up_block(8, 8, 2)
    result = cutlassfuse.fuse(model)
    assert result.model is model and isinstance(model[0], ConvTranspose3dReLUGroupNorm)


def test_a_container_with_hooks_stays_a_call_that_runs_them():
    model = ContainersAroundBlocks()
    calls = []
    model.down.register_forward_hook(lambda module, args, output: calls.append(output.shape))
    result = cutlassfuse.fuse(model)
    assert model.down in called_modules(result.model)
    result.model(torch.rand(2, 4, 3, 3, 3))
    assert calls == [torch.Size([2, 8, 3, 3, 3])]


class ResidualUnit(nn.Module):
    """MONAI's ResidualUnit: two conv blocks and a residual conv, their sum; then a block
    whose output takes a per-channel shift (broadcast), and one added in place."""

    def __init__(self):
        super().__init__()
        self.unit0 = nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.InstanceNorm3d(8), nn.PReLU())
        self.unit1 = nn.Sequential(nn.Conv3d(8, 8, 3, padding=1), nn.InstanceNorm3d(8), nn.PReLU())
        self.residual = nn.Conv3d(4, 8, 1)
        self.shifted = nn.Sequential(nn.Conv3d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU())
        self.shift = nn.Parameter(torch.randn(1, 8, 1, 1, 1))
        self.last = nn.Sequential(nn.Conv3d(8, 8, 3, padding=1), nn.GroupNorm(2, 8))

    def forward(self, x):
        y = self.unit1(self.unit0(x)) + self.residual(x)
        y = self.shifted(y) + self.shift
        z = self.last(y)
        z += y
        return z


def test_a_blocks_output_added_to_another_value_is_added_by_its_op():
    """Each add of a conv block's output that nothing else reads becomes the block's call
    with the other value as its residual; one that does not fit the output (a broadcast
    shift) is still PyTorch's add; the outputs and gradients are the original model's."""
    original = randomized(ResidualUnit().double(), seed=0)
    result = cutlassfuse.fuse(copy.deepcopy(original))
    assert len(result.replaced) == 4 and len(result.residual_adds) == 3, str(result)
    assert "unit1.0: + residual -> the block's residual" in str(result)
    graph = result.model.graph
    assert not any(n.op == "call_function" and n.target in (operator.add, torch.add) for n in graph.nodes), (
        result.model.code)
    assert sum("residual" in n.kwargs for n in graph.nodes if n.op == "call_module") == 3
    x = torch.rand(2, 4, 3, 4, 3, dtype=torch.float64, requires_grad=True)
    expected = original(x)
    got = result.model(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])


CHECKPOINT_MODELS = {
    "nested_sequential": (NestedSequential, lambda: (torch.rand(2, 4, 3, 3, 3),)),
    "chain_in_code": (ChainInCode, lambda: (torch.rand(2, 4, 3, 3, 3),)),
    "conv_also_called_alone": (ConvAlsoCalledAlone, lambda: (torch.rand(2, 4, 3, 3, 3),)),
    "two_chains_one_conv": (TwoChainsOneConv, lambda: (torch.rand(2, 4, 3, 3, 3),)),
    "decoder": (UNetDecoder3d, decoder_inputs),
}


@pytest.mark.parametrize("name", CHECKPOINT_MODELS)
def test_checkpoints_load_across_fuse_both_ways(name):
    """Saved from the original model, loaded into the fused one, and back (strict=True)."""
    make, make_inputs = CHECKPOINT_MODELS[name]
    torch.manual_seed(0)
    fused = assert_checkpoints_load_both_ways(make, make_inputs())
    assert any(isinstance(m, ConvTranspose3dReLUGroupNorm) for m in fused.modules())


def test_sequential_checkpoint_keys_keep_their_order_and_nest():
    """Keys in the original model's order; a model holding the fused one saves and loads
    them under its own prefix."""
    original = randomized(NestedSequential(), seed=0)
    fused = cutlassfuse.fuse(randomized(NestedSequential(), seed=1), channels_last=False).model
    assert list(fused.state_dict()) == list(original.state_dict())
    outer, outer_original = nn.ModuleDict({"net": fused}), nn.ModuleDict({"net": original})
    assert list(outer.state_dict()) == list(outer_original.state_dict())
    outer.load_state_dict(outer_original.state_dict(), strict=True)
    x = torch.rand(2, 4, 3, 3, 3)
    assert torch.equal(fused(x), original(x))


def test_strict_loading_still_reports_missing_and_unexpected_keys():
    original = NestedSequential()
    fused = cutlassfuse.fuse(NestedSequential()).model
    state = original.state_dict()
    del state["decoder.up.2.weight"]  # the GroupNorm's gamma
    state["decoder.up.1.weight"] = torch.ones(8)  # ReLU has none
    with pytest.raises(RuntimeError, match="Missing key.*group_norm.weight(.|\n)*Unexpected key.*decoder.up.1.weight"):
        fused.load_state_dict(state, strict=True)


def test_checkpoint_keys_survive_a_deepcopy_of_the_fused_model():
    fused = cutlassfuse.fuse(ChainInCode()).model
    assert isinstance(fused, torch.fx.GraphModule)
    assert set(copy.deepcopy(fused).state_dict()) == set(ChainInCode().state_dict())


def test_a_forward_traced_with_its_untraceable_children_called_fuses_its_own_chains():
    """A model whose forward() cannot be traced only because a child branches on a traced
    value: the child is fused on its own and called as it is, the model's own code traced
    around it (its last norm -> activation fused), the outputs and checkpoint keys the
    original's."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(4, 8, 3, padding=1)
            self.norm = nn.GroupNorm(2, 8)

        def forward(self, x):
            return torch.relu(self.norm(self.conv(x)))

    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            h = self.block(x)
            return h[:, :, :1] if x.shape[2] == 1 else h  # a branch on a size

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = Branching()
            self.norm_out = nn.GroupNorm(4, 8)
            self.conv_out = nn.Conv3d(8, 2, 1)

        def forward(self, x):
            return self.conv_out(F.silu(self.norm_out(self.up(x))))

    model = randomized(Decoder(), seed=0).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert [line.split(":")[0] for line in result.replaced] == ["up.block.conv_norm_relu", "norm_out_silu"], str(result)
    assert "the model (what it cannot trace called as it is)" in result.not_traced
    assert not result.channels_last
    called = {node.target for node in result.model.graph.nodes if node.op == "call_module"}
    assert "up" in called and isinstance(result.model.up, nn.Module)
    x = torch.randn(2, 4, 3, 5, 6)
    with torch.no_grad():
        assert torch.allclose(result.model(x), model(x), atol=1e-5)
    assert_checkpoints_load_both_ways(lambda: copy.deepcopy(model), (x,))


def test_a_forward_that_cannot_be_traced_around_its_children_stays_as_it_is():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)

        def forward(self, x):
            return F.silu(self.norm(x)) if x.sum() > 0 else x  # a branch on a traced value of its own

    model = DataDependent()
    result = cutlassfuse.fuse(model)
    assert result.model is model and result.replaced == [] and "runs in their place" not in result.not_traced


class ContiguousCalls(nn.Module):
    """A ``.contiguous()`` that only a norm, a convolution and an add read, and one that a
    ``.view()`` reads (which needs NCDHW's strides)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.conv = nn.Conv3d(4, 4, 3, padding=1)

    def forward(self, x):
        h = x.contiguous()
        y = self.conv(F.silu(self.norm(h))) + h
        z = y.contiguous()
        return z.view(z.shape[0], -1)


def test_contiguous_read_only_by_stride_agnostic_calls_keeps_the_layout():
    model = randomized(ContiguousCalls().double(), seed=0)
    result = cutlassfuse.fuse(copy.deepcopy(model))
    nodes = list(result.model.graph.nodes)
    assert sum("packed_in_its_layout" in str(n.target) for n in nodes) == 1, result.model.code
    assert sum(n.op == "call_method" and n.target == "contiguous" for n in nodes) == 1, result.model.code
    for memory_format in (torch.contiguous_format, torch.channels_last_3d):
        x = torch.rand(2, 4, 3, 4, 5, dtype=torch.float64).contiguous(memory_format=memory_format)
        torch.testing.assert_close(result.model(x), model(x), rtol=1e-12, atol=1e-12)
