"""Confidence sources beyond raw token probability, computed after the LLM stage and cached beside it.

- ``p_true`` (Kadavath et al.): after the generated call, ask whether it is correct with
  options (A) yes / (B) no; confidence = P(A) / (P(A) + P(B)) from the next-token distribution.
- ``verbalized``: ask for a confidence from 0 to 100 in a separate turn; unparseable
  answers are recorded as missing (None), never guessed.
- ``consistency``: k samples at a temperature; confidence = the fraction whose parsed call
  (API and argument JSON) equals the greedy call's.
- ``acts`` (Pal et al., 2026): the same prompt with a way out (the wording is config) —
  1 if the model still calls an API, 0 if it takes the way out. Not a confidence: the
  behaviour that action-belief consistency compares with every confidence.

Each source is stored as ``<llm cache>/source-<name>-<key>/shard-NNNNN.jsonl`` (one shard per
batch, resumable like the LLM stage), keyed by the source's own settings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_json_if, read_jsonl, stable_hash, write_jsonl
from mice_exp.errors import UserError
from mice_exp.llm.capture import generate_ids, left_pad, sample_ids, truncate
from mice_exp.llm.model import LLM
from mice_exp.llm.prompt import chat_messages, load_template, plain_text
from mice_exp.llm.records import SOURCES
from mice_exp.llm.toolcall import parse_call

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def followup_ids(llm: LLM, example: Any, demos: Sequence[Any], generated: str, question: str,
                 prompt_cfg: Mapping[str, Any]) -> list[int]:
    """The original prompt, the model's own call as its answer, then a follow-up question."""
    template, system = load_template(prompt_cfg["template"]), load_template(prompt_cfg["system"]).strip()
    if bool(prompt_cfg.get("chat_template", True)) and llm.has_chat_template:
        messages = chat_messages(example, demos, template, system)
        messages += [{"role": "assistant", "content": generated}, {"role": "user", "content": question}]
        out = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)
    text = f"{plain_text(example, demos, template, system)}{generated}\n\n{question}\nAnswer:"
    return llm.tokenizer(text, add_special_tokens=True)["input_ids"]


def option_token_ids(tokenizer: Any, option: str) -> list[int]:
    """First token of the option letter as the model may write it ("A", " A")."""
    return sorted({tokenizer.encode(v, add_special_tokens=False)[0] for v in (option, f" {option}")})


@torch.inference_mode()
def p_true(llm: LLM, prompts: Sequence[list[int]]) -> list[float]:
    ids, mask = left_pad(prompts, llm)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = llm.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
    probs = torch.softmax(logits[:, -1].float(), -1)
    yes = probs[:, option_token_ids(llm.tokenizer, "A")].sum(-1)
    no = probs[:, option_token_ids(llm.tokenizer, "B")].sum(-1)
    return (yes / (yes + no)).tolist()


def parse_percent(text: str) -> float | None:
    """The first number in ``text`` as a probability if it lies in [0, 100], else None."""
    match = _NUMBER.search(text)
    if match is None or float(match.group()) > 100:
        return None
    return float(match.group()) / 100


@torch.inference_mode()
def verbalized(llm: LLM, prompts: Sequence[list[int]], max_new_tokens: int) -> list[float | None]:
    out = generate_ids(llm, prompts, max_new_tokens)
    return [parse_percent(llm.tokenizer.decode(row, skip_special_tokens=True)) for row in out]


@torch.inference_mode()
def acts(llm: LLM, prompts: Sequence[list[int]], abstain_api: str, max_new_tokens: int) -> list[float]:
    out = generate_ids(llm, prompts, max_new_tokens)
    texts = [truncate(llm.tokenizer, row.tolist(), llm.eos_ids())[2] for row in out]
    return [0.0 if abstain_api in text else 1.0 for text in texts]


@torch.inference_mode()
def consistency(llm: LLM, prompts: Sequence[list[int]], greedy: Sequence[Mapping[str, Any]], samples: int,
                temperature: float, max_new_tokens: int, seed: int) -> list[float]:
    torch.manual_seed(seed)
    values = []
    for prompt, record in zip(prompts, greedy):
        out = sample_ids(llm, prompt, samples, max_new_tokens, do_sample=True, temperature=temperature, top_k=0,
                         top_p=1.0)
        calls = [parse_call(truncate(llm.tokenizer, row.tolist(), llm.eos_ids())[2]) for row in out]
        target = (record["pred_api"], record["pred_args"]) if record["parse_error"] is None else None
        values.append(float(np.mean([(c.api, c.args) == target for c in calls])) if target else 0.0)
    return values


def source_dir(llm_dir: Path, name: str, settings: Mapping[str, Any], prompt_cfg: Mapping[str, Any]) -> Path:
    return llm_dir / f"source-{name}-{stable_hash({'settings': dict(settings), 'prompt': dict(prompt_cfg)})}"


def compute_source(name: str, cfg: Mapping[str, Any], llm_dir: Path, examples: Mapping[str, Any],
                   records: list[dict[str, Any]], llm: LLM) -> Path:
    """Compute one source for every record (resuming finished batches); return its folder."""
    if name not in SOURCES:
        raise UserError(f"sources.use lists {name!r}; expected some of {', '.join(SOURCES)}")
    settings = cfg["sources"][name]
    out = source_dir(llm_dir, name, settings, cfg["prompt"])
    out.mkdir(parents=True, exist_ok=True)
    demos = read_json_if(llm_dir / "demos.json")
    size = int(settings.get("batch_size", cfg["llm"]["batch_size"]))
    with FileLock(str(out / ".lock")):
        for n, lo in enumerate(tqdm(range(0, len(records), size), desc=name, unit="batch")):
            shard = out / f"shard-{n:05d}.jsonl"
            if shard.exists():
                continue
            batch = records[lo:lo + size]
            if name == "consistency":
                prompts = [_original_prompt(llm, examples, demos, r, cfg["prompt"]) for r in batch]
                values = consistency(llm, prompts, batch, int(settings["samples"]), float(settings["temperature"]),
                                     int(cfg["llm"]["max_new_tokens"]), int(settings["seed"]) + n)
            elif name == "acts":
                prompts = [_original_prompt(llm, examples, demos, r, cfg["prompt"], settings["instruction"])
                           for r in batch]
                values = acts(llm, prompts, settings["abstain_api"], int(cfg["llm"]["max_new_tokens"]))
            else:
                prompts = [followup_ids(llm, examples[r["id"]], [examples[d] for d in demos[r["id"]][:r["n_demos"]]],
                                        r["text"], settings["question"], cfg["prompt"]) for r in batch]
                values = (p_true(llm, prompts) if name == "p_true"
                          else verbalized(llm, prompts, int(settings["max_new_tokens"])))
            write_jsonl(shard, [{"id": r["id"], "value": v} for r, v in zip(batch, values)])
    return out


def _original_prompt(llm: LLM, examples: Mapping[str, Any], demos: Mapping[str, list[str]], record: Mapping[str, Any],
                     prompt_cfg: Mapping[str, Any], extra_instruction: str = "") -> list[int]:
    """The record's LLM-stage prompt (same demonstrations), optionally with an instruction added to the system turn."""
    from mice_exp.llm.prompt import encode

    example = examples[record["id"]]
    kept = [examples[d] for d in demos[record["id"]][:record["n_demos"]]]
    chat = bool(prompt_cfg.get("chat_template", True)) and llm.has_chat_template
    system = load_template(prompt_cfg["system"]).strip() + (f"\n\n{extra_instruction}" if extra_instruction else "")
    return encode(llm.tokenizer, example, kept, load_template(prompt_cfg["template"]), system, chat)


def load_source(folder: Path, ids: Sequence[str]) -> np.ndarray:
    """Values aligned with ``ids``; missing answers are NaN."""
    values = {row["id"]: row["value"] for path in sorted(folder.glob("shard-*.jsonl")) for row in read_jsonl(path)}
    return np.array([np.nan if values.get(i) is None else values[i] for i in ids], dtype=np.float64)
