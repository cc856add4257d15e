"""Capture vs plain generation on a GPU with torch's cuDNN attention on and off, each over the shapes cold (first
pass) and warm (second), in one run: why capture.GPU_ATTENTION leaves cuDNN's kernels out.

    python benchmarks/gpu_attention.py PROMPTS.json [paths.cache=DIR]   (PROMPTS: benchmarks/backends.py --save-prompts)

Figures: benchmarks/backends_llama8b_random_h100.txt. The probe toggles torch's global switch; generation inside
it runs under capture.attention_kernels as well, so the 'True' rows measured cuDNN only before that change.
"""
import json, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.backends import hf_plain
from mice_exp.compose import as_plain, compose_config
from mice_exp.llm import capture
from mice_exp.llm.backends import load_llm
from mice_exp.llm.settings import LLMSettings
from mice_exp.paths import paths_from

cfg = as_plain(compose_config(["llm=llama3_1_8b_random", *sys.argv[2:]]))
llm = load_llm(LLMSettings.from_config(cfg["llm"]), paths_from(cfg["paths"]).models)
stage = json.loads(Path(sys.argv[1]).read_text())
prompts, batches = stage["ids"], stage["batches"]
plain = hf_plain(llm)

def timed(label, fn):
    torch.cuda.synchronize(); start = time.perf_counter(); cpu = time.process_time()
    out = {}
    for b in batches:
        out |= dict(zip(b, fn([prompts[i] for i in b])))
    torch.cuda.synchronize()
    print(f"{label}: {time.perf_counter() - start:.1f} s wall, {time.process_time() - cpu:.1f} s CPU", flush=True)
    return out

for cudnn in (True, False):
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    for rnd in ("cold", "warm"):
        t = timed(f"cudnn_sdp={cudnn} {rnd} plain", lambda p: plain(p, 96))
        g = timed(f"cudnn_sdp={cudnn} {rnd} capture", lambda p: [x.token_ids for x in capture.generate_batch(llm, p, 96)])
    print(f"  identical calls plain vs capture: {sum(t[i] == g[i] for i in prompts)}/{len(prompts)}")
