"""`symphony bench gpu`: without a CUDA GPU it measures nothing and says why (CI's path); its
parts run here on the CPU as they would on a GPU (the device is an argument), on the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from node.bench import BENCHMARKS, OPTIONS, chosen_parts
from node.bench.gpu import bench
from node.cli.main import main
from tests.models.conftest import tiny_ggufs  # noqa: F401  (the fixture)


def _no_gpu() -> bool:
    from models.device import detect_gpu

    return not detect_gpu().found


needs_no_gpu = pytest.mark.skipif(not _no_gpu(), reason="this machine has a usable GPU")


@needs_no_gpu
def test_without_a_gpu_the_bench_measures_nothing_and_says_why() -> None:
    figures = bench.run(quick=True)
    assert figures["gpu"] is False and figures["gpu_why"]
    assert figures["measured"].startswith("nothing: no GPU (")
    assert not any(k.startswith(("tokens_per_s", "verify", "chain")) for k in figures)


@needs_no_gpu
def test_cli_prints_one_json_object_saying_no_gpu_and_exits_0() -> None:
    result = CliRunner().invoke(main, ["bench", "gpu", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["gpu"] is False and "no GPU" in figures["measured"]


def test_the_bench_and_its_options_are_registered() -> None:
    assert BENCHMARKS["gpu"] == "node.bench.gpu.bench"
    assert OPTIONS["gpu"] == ("model", "only")
    result = CliRunner().invoke(main, ["bench", "relay", "--only", "torch"])
    assert result.exit_code != 0 and "--only applies only to: gpu" in result.output


@pytest.mark.parametrize(("only", "parts"), [
    ("", ["llama", "torch", "verify", "chain"]),
    ("chain,torch", ["torch", "chain"]),
    (" verify ", ["verify"]),
])
def test_only_selects_parts_in_their_running_order(only: str, parts: list[str]) -> None:
    assert chosen_parts(only, bench.PARTS) == parts


def test_only_refuses_an_unknown_part() -> None:
    with pytest.raises(ValueError, match=r"unknown parts \['cuda'\]"):
        chosen_parts("torch,cuda", bench.PARTS)


@pytest.mark.parametrize(("part", "via", "why"), [
    ("llama", ("torch",), "llama.cpp cannot use the GPU"),
    ("llama", ("torch", "llama.cpp"), ""),
    ("torch", ("llama.cpp",), "torch cannot use the GPU"),
    ("verify", ("torch",), ""),
    ("chain", ("torch",), "llama.cpp cannot use the GPU"),
    ("chain", (), "torch and llama.cpp cannot use the GPU"),
])
def test_a_part_says_what_it_lacks(part: str, via: tuple[str, ...], why: str) -> None:
    assert bench.missing(part, via) == why


def test_torch_part_times_both_devices_and_compares_their_tokens(
        tiny_ggufs: dict[str, Path]) -> None:  # noqa: F811
    outputs: dict[str, list[int]] = {}
    figures = bench.torch_part(str(tiny_ggufs["f32"]), [5, 17, 33], 6, outputs, gpu="cpu")
    assert len(outputs["gpu"]) == len(outputs["cpu"]) == 6
    assert figures["torch_tokens_equal_cpu"] is True  # fp32 on the CPU both times
    assert figures["torch_gpu_dtype"] == "float32"
    assert figures["tokens_per_s_torch_gpu"] > 0 and figures["torch_gpu_speedup"] > 0


def test_verify_part_checks_an_honest_generation(tiny_ggufs: dict[str, Path]) -> None:  # noqa: F811
    figures = bench.verify_part(str(tiny_ggufs["f32"]), [5, 17, 33], {"tokens": 40},
                                gpu="cpu")
    assert figures["check_chunk_s"] > 0 and figures["layer_states_s"] > 0
    assert figures["verify_cost_ratio"] > 0
    assert "verify_cost_ratio_llama" not in figures


def test_llama_cpp_runs_in_a_child_process_and_gives_the_same_tokens(
        tiny_ggufs: dict[str, Path]) -> None:  # noqa: F811
    """The llama part and the prompt's tokens come from a spawned process (llama.cpp's CUDA
    backend must not load beside torch's), with what this process would compute."""
    import os

    path = str(tiny_ggufs["f32"])
    assert bench.in_child(os.getpid) != os.getpid()
    ids = bench.in_child(bench.prompt_ids, path)
    assert ids == bench.prompt_ids(path) and ids
    figures = bench.in_child(bench._llama, path, ids, 4)
    assert figures["tokens_per_s_llama_gpu"] > 0 and figures["tokens_per_s_llama_cpu"] > 0


def test_detecting_llama_cpp_offload_leaves_it_unloaded_here() -> None:
    import subprocess
    import sys

    probe = ("import sys, models.device as d; d._llama_view(); "
             "print('llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
