"""``mice-exp mcq``: each candidate answer's log-likelihood under the LLM, as lm-eval-harness computes it.

A data set with a multiple-choice form (``Dataset.multiple_choice(example) -> (context, {name: answer})``:
When2Call's, whose context is its default MCQ task's prompt) is scored the way lm-eval-harness's ``hf`` model scores
``output_type: multiple_choice`` requests: trailing whitespace of the context moves to each answer, context +
answer is tokenized as one string and the answer's tokens are those after the context's own tokenization
(``_encode_pair``; a BOS token added as the tokenizer's ``encode`` adds it, unless the text already starts with one),
and an answer's log-likelihood is the sum of its tokens' log-probabilities. ``template=plain`` is When2Call's
``when2call`` task as it is (no chat template); ``template=chat`` is that task run with lm-eval's
``--apply_chat_template`` (the prompt as the one user turn, the assistant's turn opened).

The answers share their context, so it is encoded once (all but its last token, into a KV cache) and the answers
continue from it in one right-padded batch (causal attention keeps each answer's tokens from its padding): one
prefill per item instead of four. Items are kept in ``<cache>/llm/<llm>-mcq-<key>/shard-NNNNN.jsonl``
(``llm.batch_size`` items a shard): an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_jsonl, stable_hash, write_json, write_jsonl
from mice_exp.data.records import Example
from mice_exp.errors import UserError
from mice_exp.llm.model import LLM
from mice_exp.llm.prefix_sources import prefill
from mice_exp.llm.records import shard_name
from mice_exp.llm.stage import LLMStage

METHOD = "lm-eval-loglikelihood-1"  # how the answers are scored; part of the cache key
TEMPLATES = ("plain", "chat")
log = logging.getLogger(__name__)


def encode(tokenizer: Any, text: str) -> list[int]:
    """lm-eval's ``HFLM.tok_encode`` with ``add_bos_token`` unset: the tokenizer's own special tokens, none where
    the text already starts with its BOS token (a chat template that writes it)."""
    bos = tokenizer.bos_token
    return tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))


def encode_pair(tokenizer: Any, context: str, answer: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair`` for a causal model: (the context's tokens, the answer's tokens)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, answer = context[:-spaces], context[-spaces:] + answer
    whole, head = encode(tokenizer, context + answer), encode(tokenizer, context)
    return head, whole[len(head):]


@torch.inference_mode()
def answer_logliks(llm: LLM, context: Sequence[int], answers: Sequence[Sequence[int]]) -> list[float]:
    """Each answer's summed token log-probability after ``context``: the context but its last token prefilled
    once, then every answer (its row: the context's last token, then the answer but its last) in one batch."""
    cache = prefill(llm, context[:-1])
    rows = [[context[-1], *answer[:-1]] for answer in answers]
    ids = torch.full((len(rows), max(len(r) for r in rows)), llm.tokenizer.pad_token_id or 0, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
    cache.batch_repeat_interleave(len(rows))
    logits = llm.model(input_ids=ids.to(llm.device), **{llm.cache_arg: cache}, use_cache=True).logits
    out = []
    for b, answer in enumerate(answers):
        logp = torch.log_softmax(logits[b, :len(answer)].float(), dim=-1)
        out.append(float(logp.gather(1, torch.tensor(list(answer), device=logp.device)[:, None]).sum()))
    return out


def render(tokenizer: Any, prompt: str, template: str) -> str:
    """The context text for ``template`` (module docstring)."""
    if template == "plain":
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("template=chat: this LLM's tokenizer has no chat template; expected template=plain "
                        "(When2Call's task as it is) or an LLM with one")
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def score_item(llm: LLM, prompt: str, choices: dict[str, str], template: str) -> dict[str, Any]:
    """One item's answers scored: their log-likelihoods, lengths in characters (``acc_norm``'s divisor) and
    tokens, and the context's length in tokens."""
    context = render(llm.tokenizer, prompt, template)
    pairs = {name: encode_pair(llm.tokenizer, context, text) for name, text in choices.items()}
    head = next(iter(pairs.values()))[0]  # the context's tokens do not depend on the answer
    lls = answer_logliks(llm, head, [answer for _, answer in pairs.values()])
    return {"loglik": dict(zip(choices, lls)), "chars": {name: len(text) for name, text in choices.items()},
            "tokens": {name: len(answer) for name, (_, answer) in pairs.items()}, "prompt_tokens": len(head)}


def mcq_items(stage: LLMStage, template: str) -> list[dict[str, Any]]:
    """Every selected item's answers scored (:func:`score_item`) with its id, class, split and source, computing
    only the shards not yet cached (the LLM loads only then)."""
    if template not in TEMPLATES:
        raise UserError(f"template={template!r}; expected one of {', '.join(TEMPLATES)}")
    dataset = stage.dataset
    pose = getattr(dataset, "multiple_choice", None)
    if pose is None:
        raise UserError(f"dataset={dataset.name} has no multiple-choice form; expected dataset=when2call")
    selection = stage.selection  # the data load only now
    examples: list[Example] = selection.examples
    posed = [pose(e) for e in examples]
    key = {"method": METHOD, "template": template, **stage.llm.weights(),
           "items": stable_hash([[e.id, p] for e, p in zip(examples, posed)])}
    out = stage.paths.llm / f"{stage.llm.name}-mcq-{stable_hash(key)}"
    size = int(stage.llm.batch_size)
    groups = [range(lo, min(lo + size, len(examples))) for lo in range(0, len(examples), size)]
    names = [out / f"{shard_name(n, len(groups))}.jsonl" for n in range(len(groups))]
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out / ".lock")):
        todo = [n for n, name in enumerate(names) if not name.exists()]
        if todo:
            write_json(out / "key.json", key)
            llm = stage.backend.forward_model()
            bar = tqdm(total=len(examples), initial=len(examples) - sum(len(groups[n]) for n in todo),
                       desc=f"mcq {stage.llm.name}", unit="item")
            for n in todo:
                rows = []
                for i in groups[n]:
                    e = examples[i]
                    rows.append({"id": e.id, "class": e.api, "split": selection.splits[e.id],
                                 "conversation": dataset.conversation(e), "n_tools": len(e.tool_names)}
                                | score_item(llm, *posed[i], template))
                    bar.update(1)
                write_jsonl(names[n], rows)
            bar.close()
    return [row for name in names for row in read_jsonl(name)]


def default_path(stage: LLMStage, template: str) -> Path:
    """``experiments/<dataset>/mcq-<llm>-<template>.json``."""
    return stage.paths.root / "experiments" / stage.dataset.name / f"mcq-{stage.llm.name}-{template}.json"


def write_mcq(stage: LLMStage, template: str, path: Path) -> int:
    """The scored items (:func:`mcq_items`) as one JSON file with what made them; returns how many."""
    items = mcq_items(stage, template)
    write_json(path, {"dataset": stage.dataset.name, "llm": stage.llm.name, "display": stage.llm.title,
                      "template": template,
                      "method": METHOD, "items": items})
    return len(items)
