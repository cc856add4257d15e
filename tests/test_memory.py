"""Keeping freed memory on the heap changes where tensors live, never what the model computes."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from mice_exp.paths import PACKAGE_ROOT

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's (elsewhere it is a no-op)")

# A float32 model wide enough that its activations (3 prompts x ~25 tokens x 4,096) pass glibc's mmap threshold.
GENERATE = textwrap.dedent("""
    import hashlib, sys, torch
    from pathlib import Path
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from mice_exp.llm.assets import converted_dir
    from mice_exp.llm.capture import generate_batch
    from mice_exp.llm.memory import keep_freed_memory
    from mice_exp.llm.model import LLM
    from omegaconf import OmegaConf
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    source = OmegaConf.to_container(OmegaConf.load("conf/llm/tiny_random.yaml"))["source"]
    tok = AutoTokenizer.from_pretrained(converted_dir(source["tokenizer"], Path(".cache/models")))
    tok.padding_side = "left"
    config = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=256, intermediate_size=4096,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    llm = LLM(AutoModelForCausalLM.from_config(config).eval(), tok, "wide", torch.device("cpu"))
    prompts = [tok(p)["input_ids"] for p in ["User Query: add 90 days to 2022-10-14\\nAction:", "Hello there",
                                              "User Query: what is the weather in Paris tomorrow, please?\\n"]]
    digest = hashlib.sha256()
    for g in generate_batch(llm, prompts, max_new_tokens=10):
        digest.update(bytes(str(g.token_ids), "utf8") + g.token_probs.tobytes() + g.lens_ids.tobytes()
                      + g.states.tobytes())
    print(digest.hexdigest())
""")

FAULTS = textwrap.dedent("""
    import resource, sys, torch
    from mice_exp.llm.memory import keep_freed_memory
    if sys.argv[1] == "keep":
        keep_freed_memory()
    torch.manual_seed(0)
    x, w, w2 = torch.randn(2000, 576), torch.randn(1536, 576), torch.randn(576, 1536)
    def layer(h):  # a transformer MLP's allocations: two 12 MB GEMM outputs, their product, a 4.6 MB output
        up = torch.nn.functional.linear(h, w)
        return h + torch.nn.functional.linear(torch.nn.functional.silu(up) * torch.nn.functional.linear(h, w), w2)
    h = layer(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        h = layer(h) / 10
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def run(code: str, mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_ROOT, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    return out.stdout.strip()


def test_generation_is_bit_for_bit_the_same_with_freed_memory_kept():
    assert run(GENERATE, "keep") == run(GENERATE, "default")


HEAP = textwrap.dedent("""
    import ctypes, sys, torch
    from mice_exp.llm.memory import keep_freed_memory
    class Mallinfo2(ctypes.Structure):  # glibc >= 2.33
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = Mallinfo2
    if sys.argv[1] == "keep":
        keep_freed_memory()
    before = mallinfo2()
    x = torch.empty(12 << 20, dtype=torch.uint8)  # an activation's size: past glibc's default mmap threshold
    alive = mallinfo2()
    del x
    freed = mallinfo2()
    print(alive.hblkhd - before.hblkhd, alive.arena - before.arena, freed.fordblks - before.fordblks)
""")


def test_a_large_tensor_lives_on_the_heap_and_its_memory_stays_there_when_freed():
    """By default glibc maps a 12 MB block of its own and unmaps it on free; kept, the block comes from the
    heap and, freed, stays in it for the next op (read from glibc's own books, so it holds on any kernel)."""
    mb = 1 << 20  # the heap grows by a little less than the block where free memory was already at its top
    mapped, heap, free_in_heap = map(int, run(HEAP, "default").split())
    assert mapped >= 12 * mb and heap < mb and free_in_heap < mb
    mapped, heap, free_in_heap = map(int, run(HEAP, "keep").split())
    assert mapped == 0 and heap > 11 * mb and free_in_heap > 11 * mb


def test_a_models_activations_fault_in_fewer_pages_with_freed_memory_kept():
    """Ten MLP layers after a first one: glibc's default maps (and faults in) fresh pages for every large
    output; kept on the heap, freed blocks are reused. How many faults go depends on the kernel: ~100,000
    against ~18,000 on one machine of this kind (transparent huge pages on madvise), 20,640 against 12,014
    on another (CI, 2026-11-25). Never all: torch allocates with posix_memalign, whose slack can leave a
    freed block a few bytes short of the next request of the same size. (numpy arrays would hide all this:
    numpy asks for huge pages.)"""
    default, kept = int(run(FAULTS, "default")), int(run(FAULTS, "keep"))
    assert default > 5_000  # the pattern does allocate past glibc's mmap threshold
    assert kept < 0.8 * default
