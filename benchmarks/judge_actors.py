"""Judging K actors' calls on the same queries: one shared prefill per query against one prefill per call.

On STE's queries of the first ``--apis`` APIs, K actors of ``../shared/data/ste_actors`` (K = 1, 4, 16: the first K
of :data:`ORDER`), each actor's parsed call rendered canonically (:meth:`CallFormat.canonical`), per K:

* ``shared``: what ``mice-exp records actor=...`` runs (:func:`mice_exp.llm.judge.judge_actors`): per query the
  prompt's prefill once into a KV cache, then the query's distinct canonical calls (actors that made the same call
  are one reply) in one batched pass after it (:func:`mice_exp.llm.teacher.score_shared`);
* ``shared_all``: the same without merging equal calls: all K calls after the one prefill;
* ``one_by_one``: each actor's call teacher-forced with its own prefill (:func:`score_replies`, one row at a time:
  K prefills per query), timed on the first ``--one-by-one`` queries and scaled to all of them.

Every pass computes the logit lens of every layer at the call's positions (what a MICE view reads), and the judged
records of ``shared`` and ``shared_all`` are checked against ``one_by_one``'s on those queries: raw confidence and
every token probability within 1e-5, every layer string equal (the BERTScore features are a function of the
layer strings and the text). Prints the CPU, torch's threads and the load average at start and end; time it on a
quiet machine (load < 1.5).

    .venv/bin/python benchmarks/judge_actors.py [--llm smollm2_135m] [--apis 2] [--k 1,4,16] [--one-by-one 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mice_exp.compose import compose_config
from mice_exp.llm.actors import actor_path, read_actor
from mice_exp.llm.runner import Calls
from mice_exp.llm.teacher import score_replies, score_shared
from mice_exp.pipeline import Pipeline

#: The actors in the order K takes them: the 12 runs on all 750 queries, then the continual-learning rounds.
ORDER = ("mistral_FT", "llama-7Bf_FT_no_reflection", "llama-7Bf_FT_no_STM", "llama-7Bf_FT", "llama-7Bf_FT_flan",
         "llama-7Bf_FT_no_LTM", "llama-7Bf_FT_no_exec", "llama-13Bf_ICL", "llama-7Bf_ICL", "mistral", "llama-13Bf",
         "llama-7Bf", "CL_round_3", "CL_round_3_no_replay", "CL_round_2", "CL_round_2_no_replay")
clock = time.perf_counter


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--k", default="1,4,16")
    parser.add_argument("--one-by-one", type=int, default=4, help="queries the one-by-one pass is timed on")
    parser.add_argument("--cache", default=".cache", help="where the converted models are")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    print(f"CPU: {cpu()}; torch threads {torch.get_num_threads()}; load at start {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as scratch:
        cfg = compose_config([f"llm={args.llm}", f"dataset.max_apis={args.apis}", "tracking.enabled=false",
                              f"paths.cache={Path(args.cache).resolve()}"])
        stage = Pipeline.from_config(cfg).stage
        examples = {e.id: e for e in stage.selection.examples}
        every = {e.id: e for e in stage.dataset.load(stage.paths)}
        folder = Path(cfg["paths"]["root"] or ".").resolve() / "../shared/data/ste_actors"
        actors = [read_actor(actor_path(n, folder, Path(".")), every) for n in ORDER[:max(ks)]]
        teacher = stage.backend.teacher()
        llm, tok = teacher.llm, teacher.tokenizer
        runner = stage.runner(tok)
        demos = stage.demos(Path(scratch))
        queries = sorted(examples)
        prompts = runner.prompts(examples, demos, examples)[0]
        calls = {i: [] for i in queries}  # per query, each actor's canonical call in ORDER
        for actor in actors:
            for c in actor.judged():
                if c.id in calls:
                    calls[c.id].append(runner.fmt.canonical(c.api, c.args))
        print(f"{args.llm}: {len(queries)} queries (first {args.apis} APIs), mean prompt "
              f"{np.mean([len(p.ids) for p in prompts.values()]):.0f} tokens")
        score_shared(llm, prompts[queries[0]].ids, [tok.encode(calls[queries[0]][0], add_special_tokens=False)])  # warm

        def records(i, texts, gens):
            return runner.records(tok, Calls(examples, stage.selection.splits, prompts), [i] * len(texts), gens)[0]

        def run(k: int, how: str, subset: list[str]) -> tuple[float, int, dict]:
            out, n, start = {}, 0, clock()
            for i in subset:
                texts = calls[i][:k] if how != "shared" else list(dict.fromkeys(calls[i][:k]))
                ids = [tok.encode(t, add_special_tokens=False) for t in texts]
                if how == "one_by_one":
                    gens = [g for r in ids for g in score_replies(llm, [prompts[i].ids], [r], states=False)]
                else:
                    gens = score_shared(llm, prompts[i].ids, ids, states=False)
                out.update({(i, t): r for t, r in zip(texts, records(i, texts, gens))})
                n += len(texts)
            return clock() - start, n, out

        rows = []
        for k in ks:
            n_calls = sum(len(calls[i][:k]) for i in queries)
            few = queries[:args.one_by_one]
            t_obo, _, ref = run(k, "one_by_one", few)
            scale = len(queries) / len(few)
            line = {"k": k, "calls": n_calls, "one_by_one_s": t_obo * scale}
            for how in ("shared", "shared_all"):
                seconds, scored, got = run(k, how, queries)
                worst, same = 0.0, True
                for key, r in ref.items():
                    mine = got[key]
                    worst = max(worst, abs(mine["raw_confidence"] - r["raw_confidence"]),
                                float(np.max(np.abs(np.subtract(mine["token_probs"], r["token_probs"])))))
                    same &= mine["layer_strings"] == r["layer_strings"]
                assert worst <= 1e-5 and same, (how, k, worst, same)
                line |= {f"{how}_s": seconds, f"{how}_replies": scored, f"{how}_max_diff": worst}
            rows.append(line)
            print(f"K={k:2d}: {n_calls} calls; shared {line['shared_s']:.1f} s ({line['shared_replies']} distinct "
                  f"replies), shared_all {line['shared_all_s']:.1f} s, one by one {line['one_by_one_s']:.1f} s "
                  f"(timed on {len(few)} queries, scaled); max |diff| vs one by one {line['shared_max_diff']:.1e} / "
                  f"{line['shared_all_max_diff']:.1e}, layer strings equal", flush=True)
        base = rows[0]
        for line in rows[1:]:
            print(f"K={line['k']} / K={base['k']}: shared {line['shared_s'] / base['shared_s']:.2f}x, shared_all "
                  f"{line['shared_all_s'] / base['shared_all_s']:.2f}x, one by one "
                  f"{line['one_by_one_s'] / base['one_by_one_s']:.2f}x")
    print(f"load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
