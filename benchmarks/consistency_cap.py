"""Self-consistency samples cut at the greedy call's length + 16 tokens: does any agreement change?

The same samples (one seed) are scored uncut and cut, so only a sample that agrees with the greedy
call yet runs over the cap could change a value. `python benchmarks/consistency_cap.py smollm2_135m 12`
(12 test calls, 10 samples each at temperature 1; output in the README).
"""
import sys, tempfile, time
from pathlib import Path
import torch
from mice_exp.compose import as_plain, compose_config
from mice_exp.paths import paths_from
from mice_exp.llm.records import read_records_file
from mice_exp.llm.sources import Prompts, prefill, agreement, shared_length
from mice_exp.llm.capture import generate_ids, truncate
from mice_exp.llm.stage import retrieved_demos
from mice_exp.llm.model import load_llm
from mice_exp.llm.toolcall import parse_call
from mice_exp.data import select_examples
L, n = sys.argv[1], int(sys.argv[2])
cfg = as_plain(compose_config([f"llm={L}", "+experiment=action_belief"]))
paths = paths_from(cfg["paths"])
stage = read_records_file(Path(f"experiments/records/ste-{L}.jsonl.gz"), "ste")
sel = select_examples(cfg["dataset"], paths); ex = {e.id: e for e in sel.examples}
demos = retrieved_demos(Path(tempfile.mkdtemp()), cfg, sel.examples, 8)
llm = load_llm(cfg["llm"], paths.models)
torch.manual_seed(0)
tests = [r for r in stage.records if r["split"] == "test"]
recs = tests[::len(tests) // n][:n]
diff = agree_long = total = 0; lens = []
t = time.time()
for r in recs:
    p = Prompts(llm, cfg, ex[r["id"]], [ex[d] for d in demos[r["id"]][:r["n_demos"]]], r)
    cache = prefill(llm, p.original[:-1]); cache.batch_repeat_interleave(10)
    out = generate_ids(llm, [p.original] * 10, 96, past_key_values=cache, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    cap = len(r["token_ids"]) + 16
    full = [parse_call(truncate(llm.tokenizer, row.tolist(), llm.eos_ids())[2]) for row in out]
    cut = [parse_call(truncate(llm.tokenizer, row[:cap].tolist(), llm.eos_ids())[2]) for row in out]
    a, b = agreement(full, r), agreement(cut, r)
    kept = [len(truncate(llm.tokenizer, row.tolist(), llm.eos_ids())[0]) for row in out]
    lens += [k - len(r["token_ids"]) for k, c in zip(kept, full) if r["parse_error"] is None and (c.api, c.args) == (r["pred_api"], r["pred_args"])]
    diff += a != b; total += 1
    print(r["id"], len(r["token_ids"]), out.shape[1], f"{a:.1f} {b:.1f}", flush=True)
print(f"{total} calls, {diff} with a different agreement; agreeing samples' length - greedy length: {sorted(set(lens))}; {time.time()-t:.0f}s")
