"""The profile CLI's ncu command and its CSV summary (ncu itself needs a GPU)."""

import pytest

from cutlassfuse.profiling import ncu_command, run_profile, summarize, tensor_pipe_metrics

CSV = '''==PROF== Connected to process
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","533.86"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","54.74"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","%","n/a"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","%","0"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed","%","81.20"
"0","1","python","h","void cutlass::device_kernel<cutlass::conv::kernel::ConvUniversal<X>>(T1)","1","7","(384, 1, 1)","(4913, 1, 1)","0","9.0","Command line profiler metrics","sm__ops_path_tensor_src_fp16_dst_fp32.avg.pct_of_peak_sustained_elapsed","%","79.00"
"1","1","python","h","void cutlassfuse::group_norm_finish_kernel<__half, false, false>(...)","1","7","(256, 1, 1)","(615, 16, 1)","0","9.0","Occupancy","Achieved Occupancy","%","60.22"
'''


def test_summary_table_shows_the_largest_tensor_pipe_reading():
    table = summarize(CSV)
    assert "| kernel | duration | SM % | tensor pipe % | occupancy % |" in table
    assert "| ConvUniversal | 533.86 us | 54.74 % | 81.20 % | - |" in table
    assert "| group_norm_finish | - | - | - | 60.22 % |" in table


def test_tensor_pipe_metrics_are_those_ncu_knows():
    hopper = "sm__pipe_tensor_op_gmma_cycles_active   Counter   cycles\nsm__ops_path_tensor_src_fp16_dst_fp32 Counter"
    assert tensor_pipe_metrics(hopper) == (
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__ops_path_tensor_src_fp16_dst_fp32.avg.pct_of_peak_sustained_elapsed")
    assert tensor_pipe_metrics("sm__pipe_tensor_op_gmma_cycles_active_extra Counter") == ()
    command = ncu_command("kb61", "float16", "ncdhw", ("m1", "m2"))
    assert command[command.index("--metrics") + 1] == "m1,m2"


def test_command_keeps_clocks_and_profiles_one_bracketed_call():
    command = ncu_command("kb61", "float16", "ncdhw")
    assert command[command.index("--clock-control") + 1] == "none"
    assert command[command.index("--profile-from-start") + 1] == "off"
    assert command[-3:] == ["kb61", "float16", "ncdhw"]


def test_profile_without_ncu_says_so(monkeypatch):
    monkeypatch.setenv("NCU", "/nonexistent/ncu")
    with pytest.raises(SystemExit, match="ncu not found at /nonexistent/ncu"):
        run_profile("kb61", "float16", "ncdhw")
