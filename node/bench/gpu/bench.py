"""`symphony bench gpu`: what a CUDA GPU does for a node, each figure beside its CPU baseline
measured in the same run. Sized to finish in about 5 minutes on one GPU.

Without a usable CUDA GPU it measures nothing and says so: ``gpu`` false and ``gpu_why``
(models.device.detect_gpu's reason: no torch CUDA build, no driver, llama.cpp built without
offload). With one, each part runs when what it needs is there, else ``<part>_measured`` is
false and ``<part>_why`` says why:

* ``llama``: greedy tokens/s of the model through llama.cpp with every layer offloaded
  (``n_gpu_layers=-1``), ``tokens_per_s_llama_gpu``, and with none (``_cpu``, all cores);
  ``llama_gpu_speedup`` is their ratio. Needs llama-cpp-python built with CUDA.
* ``torch``: the whole model's blocks in this process on the GPU in half precision
  (models.blocks, the code block servers run), ``tokens_per_s_torch_gpu``, beside the same
  in fp32 on the CPU (``_cpu``); ``torch_tokens_equal_cpu`` says whether fp16 and fp32 chose
  the same tokens.
* ``verify``: the layer-state verifier (models.layer_states, fp32) on the GPU: the executor's
  layer-state prefill (``layer_states_s``) and one chunk's check (``check_chunk_s``, the mean
  over every chunk and three layer draws), over the GPU generation it checks:
  ``verify_cost_ratio`` (torch's generation) and ``verify_cost_ratio_llama`` (llama.cpp's).
* ``chain``: a 2-stage chain, each stage a block server daemon (``--serve-blocks``) on the
  same GPU (``[inference] device``), driven by a requester daemon on loopback:
  ``tokens_per_s_chain2_gpu`` and ``chain2_overhead_ratio`` (time per token over the
  in-process GPU run); ``chain2_tokens_equal_single`` compares their tokens. Needs libp2p
  and llama-cpp-python (the requester's tokenizer).

Generations are ``TOKENS`` tokens (``QUICK_TOKENS`` with --quick), greedy, never stopped
early by an end-of-text token, each timed after a warm-up, the fastest of ``REPEATS``.
``--model PATH`` times another GGUF (e.g. node/bench/gpu/shaped_model.py's, with the default
model's shape); ``--only a,b`` runs only those parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from node.bench import chosen_parts

T = TypeVar("T")

PARTS = ("llama", "torch", "verify", "chain")
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg")
TOKENS = 64
QUICK_TOKENS = 16
#: each timed generation runs this often after its warm-up; the fastest counts
REPEATS = 2
#: the CUDA device every GPU part runs on
GPU = "cuda:0"


def run(quick: bool, model: str = "", only: str = "") -> dict[str, Any]:
    from models.device import detect_gpu

    started = time.perf_counter()
    report = detect_gpu()
    figures: dict[str, Any] = {"gpu": report.found, "gpu_name": report.name,
                               "gpu_memory_gib": round(report.memory_bytes / 2**30, 1),
                               "gpu_via": ",".join(report.via), "gpu_why": report.why}
    if not report.found:
        figures["measured"] = f"nothing: no GPU ({report.why})"
        return figures
    parts = chosen_parts(only, PARTS)
    from models.registry import resolve

    info = resolve(model or None)
    figures.update({"model": info.name, "model_path": str(info.path),
                    "tokens": QUICK_TOKENS if quick else TOKENS})
    ids = in_child(prompt_ids, str(info.path))
    outputs: dict[str, list[int]] = {}  # the torch part's GPU tokens, for the chain's check
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "llama": lambda: in_child(_llama, str(info.path), ids, figures["tokens"]),
        "torch": lambda: torch_part(str(info.path), ids, figures["tokens"], outputs, GPU),
        "verify": lambda: verify_part(str(info.path), ids, figures, GPU),
        "chain": lambda: _chain(str(info.path), figures, outputs.get("gpu")),
    }
    for part in parts:
        why = missing(part, report.via)
        if why:
            figures.update({f"{part}_measured": False, f"{part}_why": why})
            continue
        figures.update(runs[part]())
        figures[f"{part}_measured"] = True
    figures["wall_s"] = round(time.perf_counter() - started, 3)
    return figures


def missing(part: str, via: Sequence[str]) -> str:
    """Why ``part`` cannot run with a GPU used by ``via`` ("" = it can)."""
    import importlib.util

    needs = {"llama": ("llama.cpp",), "torch": ("torch",), "verify": ("torch",),
             "chain": ("torch", "llama.cpp")}[part]
    lacking = [lib for lib in needs if lib not in via]
    if lacking:
        return f"{' and '.join(lacking)} cannot use the GPU"
    if part == "chain" and importlib.util.find_spec("libp2p") is None:
        return "libp2p is not installed (the daemons need it)"
    return ""


def in_child(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh (spawned) process. llama.cpp runs there, away from this
    process's torch: on a GPU machine, llama.cpp loading its CUDA backend into a process whose
    torch already held CUDA crashed it (two CUDA runtimes, pip's and the system's)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def prompt_ids(path: str) -> list[int]:
    """PROMPT as the model's tokenizer (llama.cpp's, vocab only) gives it; without
    llama-cpp-python, as many fixed ids (the torch parts' timing needs only their count)."""
    try:
        import llama_cpp
    except ImportError:
        return [(7919 * i + 17) % 1000 + 100 for i in range(len(PROMPT.split()) * 4 // 3)]
    tok = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    add_bos = tok.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    ids = list(tok.tokenize(PROMPT.encode(), add_bos=add_bos, special=True))
    tok.close()
    return ids


def fastest(generate: Callable[[], list[int]]) -> tuple[list[int], float]:
    """A warm-up, then ``REPEATS`` timed runs: (tokens of the last, fastest wall seconds)."""
    generate()
    best, tokens = float("inf"), []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        tokens = generate()
        best = min(best, time.perf_counter() - t0)
    return tokens, best


def _llama(path: str, ids: list[int], n: int) -> dict[str, Any]:
    import llama_cpp

    figures: dict[str, Any] = {}
    for where, layers in (("gpu", -1), ("cpu", 0)):
        llm = llama_cpp.Llama(model_path=path, n_gpu_layers=layers, n_ctx=512, seed=0,
                              verbose=False)

        def generate(llm: Any = llm) -> list[int]:
            llm.reset()
            out: list[int] = []
            for token in llm.generate(ids, temp=0.0, reset=True):
                out.append(int(token))
                if len(out) == n:
                    break
            return out

        tokens, wall = fastest(generate)
        figures[f"tokens_per_s_llama_{where}"] = round(len(tokens) / wall, 3)
        if where == "gpu":
            figures["generate_s_llama_gpu"] = round(wall, 4)
        llm.close()
    figures["llama_gpu_speedup"] = round(figures["tokens_per_s_llama_gpu"]
                                         / figures["tokens_per_s_llama_cpu"], 3)
    return figures


def torch_part(path: str, ids: list[int], n: int, outputs: dict[str, list[int]],
               gpu: str = GPU) -> dict[str, Any]:
    """The "torch" part; ``gpu`` is the device of its "gpu" run (tests pass "cpu")."""
    from models.blocks import LocalTarget, greedy

    figures: dict[str, Any] = {}
    for where in ("gpu", "cpu"):
        target = LocalTarget.from_gguf(path, device=gpu if where == "gpu" else "cpu")

        def generate(target: LocalTarget = target) -> list[int]:
            target.rollback(0)
            return greedy(target, ids, n)

        outputs[where], wall = fastest(generate)
        figures[f"tokens_per_s_torch_{where}"] = round(len(outputs[where]) / wall, 3)
        if where == "gpu":
            figures["generate_s_torch_gpu"] = round(wall, 4)
            figures["torch_gpu_dtype"] = str(target.stage.dtype).removeprefix("torch.")
    figures["torch_gpu_speedup"] = round(figures["tokens_per_s_torch_gpu"]
                                         / figures["tokens_per_s_torch_cpu"], 3)
    figures["torch_tokens_equal_cpu"] = outputs["gpu"] == outputs["cpu"]
    return figures


def verify_part(path: str, ids: list[int], figures: dict[str, Any],
                gpu: str = GPU) -> dict[str, Any]:
    """The verifier on ``gpu`` over the tokens a generation there gave (see the docstring)."""
    from types import SimpleNamespace

    from models.blocks import LocalTarget, greedy
    from models.fingerprint import DEFAULT_CHUNK
    from models.gguf_torch import load_gguf_model
    from node.bench.models import layer_check_times

    n = int(figures["tokens"])
    target = LocalTarget.from_gguf(path, device=gpu)

    def generate() -> list[int]:
        target.rollback(0)
        return greedy(target, ids, n)

    output, generate_s = fastest(generate)
    model, _ = load_gguf_model(path)
    backend = SimpleNamespace(model=model.to(gpu))  # all layer_states needs of one
    gen = SimpleNamespace(prompt_token_ids=ids, token_ids=output)
    chunks = -(-len(output) // DEFAULT_CHUNK)
    layer_check_times(backend, gen, chunks)  # warm-up: CUDA kernels, allocator
    states_s, checks = layer_check_times(backend, gen, chunks)
    out: dict[str, Any] = {"layer_states_s": round(states_s, 6),
                           "check_chunk_s": round(sum(checks) / len(checks), 6),
                           "check_chunk_s_worst": round(max(checks), 6),
                           "verify_generate_s_torch_gpu": round(generate_s, 6)}
    out["verify_cost_ratio"] = round(out["check_chunk_s"] / generate_s, 6)
    if "generate_s_llama_gpu" in figures:
        out["verify_cost_ratio_llama"] = round(out["check_chunk_s"]
                                               / figures["generate_s_llama_gpu"], 4)
    return out


def _chain(path: str, figures: dict[str, Any], single: list[int] | None) -> dict[str, Any]:
    """Two block servers on the GPU and a requester, as daemons (see the docstring)."""
    from models.gguf_reader import block_count
    from node.bench.distributed.testnet import RequesterSpec, chain_testnet, split

    n = int(figures["tokens"])
    servers = dict(zip(("s0", "s1"), split(block_count(path), 2), strict=True))
    requesters = {"r2": RequesterSpec(("s0", "s1"))}
    with chain_testnet(servers, requesters, name="gpu", inference={"model": path},
                       server_inference={"device": GPU}) as net:
        net.wait()
        answers = []
        net.generate("r2", PROMPT, 2)  # warm-up: the requester loads its head and tokenizer
        for _ in range(REPEATS):
            answers.append(net.generate("r2", PROMPT, n))
    best = max(answers, key=lambda a: len(a["tokens"]) / a["wall_s"])
    tps = len(best["tokens"]) / best["wall_s"]
    out: dict[str, Any] = {"tokens_per_s_chain2_gpu": round(tps, 3),
                           "chain2_tokens": len(best["tokens"])}
    if "tokens_per_s_torch_gpu" in figures and single is not None:
        out["chain2_overhead_ratio"] = round(figures["tokens_per_s_torch_gpu"] / tps, 3)
        # the chain stops at an end-of-text token, the in-process run does not
        out["chain2_tokens_equal_single"] = best["tokens"] == single[:len(best["tokens"])]
    return out
