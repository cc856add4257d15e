"""Keeping freed memory on the heap changes where tensors live, never what the model computes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from mice_exp.paths import PACKAGE_ROOT

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
    x = torch.randn(3000, 4096)  # 48 MB, an activation of a prefill's MLP
    torch.nn.functional.silu(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        torch.nn.functional.silu(x)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def run(code: str, mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_ROOT, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    return out.stdout.strip()


def test_generation_is_bit_for_bit_the_same_with_freed_memory_kept():
    assert run(GENERATE, "keep") == run(GENERATE, "default")


def test_a_reallocated_large_block_faults_in_no_new_pages():
    """Five 48 MB activations after a first one: glibc's default maps (and faults in) ~12,000 fresh pages
    for each; kept on the heap, the first one's pages are reused. (numpy arrays would hide this: numpy asks
    for huge pages for large arrays; torch does not.)"""
    default, kept = int(run(FAULTS, "default")), int(run(FAULTS, "keep"))
    assert default > 5 * 10_000
    assert kept < default / 10
