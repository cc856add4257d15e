"""MICE features: BERTScore F1 between the final output y and each layer's logit-lens string y^(i)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_intact, read_npz, stable_hash, write_npz
from mice_exp.devices import resolve_device
from mice_exp.errors import UserError
from mice_exp.llm.records import StageOutput
from mice_exp.loading import load_checked
from mice_exp.packages import default_model_path


class _SpecialTokens:
    """bert-score 0.3.13 calls ``build_inputs_with_special_tokens([])``, which transformers 5 removed.

    It is only used to encode an empty string, so wrap a [CLS]-first / [SEP]-last encoder.
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def build_inputs_with_special_tokens(self, ids: Sequence[int]) -> list[int]:
        special = self._tokenizer("", add_special_tokens=True)["input_ids"]
        return special[:1] + list(ids) + special[1:]


def make_scorer(encoder: Mapping[str, Any]) -> Any:
    """A ``bert_score.BERTScorer`` for the configured encoder (default: the packaged all-MiniLM-L6-v2), loaded
    once per process and encoder: a gate scores every request with the one it loaded first."""
    return _scorer(str(encoder.get("model") or default_model_path()), int(encoder["num_layers"]),
                   int(encoder.get("batch_size", 64)), str(encoder.get("device", "cpu")))


def _ties_by_text(items: Any, key: Any = None, reverse: bool = False) -> list:
    """``sorted`` for bert-score's module: its one call orders the deduplicated sentences of a call by word
    count, ties in the order of a ``set`` of strings, which Python's per-process hash seed shuffles; so the
    encoder's batches, their padded widths and the scores' last bits (~1e-7, enough to flip a random forest's
    split) changed from run to run. Ties are put in the order of their text first (the sort is stable)."""
    return sorted(sorted(items), key=key, reverse=reverse)


def _load_encoder(model_type: str, num_layers: int, all_layers: bool = False) -> Any:
    """bert-score's ``get_model`` without its path test: the class comes from the folder's config (bert-score
    loads a ``T5EncoderModel`` wherever "t5" is in the path, e.g. a checkout under ``~/t5/``), every weight is
    checked (:func:`~mice_exp.loading.load_checked`), and the encoder is cut to its first ``num_layers`` layers,
    as bert-score cuts a BERT-family encoder."""
    import torch
    from transformers import AutoModel

    model = load_checked(AutoModel, model_type, "features.encoder.model").eval()
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if layers is None:
        raise UserError(f"features.encoder.model={model_type!r} is a {type(model).__name__}; expected a BERT-family "
                        "encoder (its layers in encoder.layer), as the MICE features use")
    if not all_layers:
        if not 0 <= num_layers <= len(layers):
            raise UserError(f"features.encoder.num_layers={num_layers}; expected 0..{len(layers)} for {model_type}")
        model.encoder.layer = torch.nn.ModuleList(layers[:num_layers])
    return model


@functools.lru_cache(maxsize=4)
def _scorer(model: str, num_layers: int, batch_size: int, device: str) -> Any:
    import bert_score.scorer
    import bert_score.utils
    from bert_score import BERTScorer

    bert_score.utils.sorted = _ties_by_text  # the module's own name lookup finds it before the builtin
    bert_score.scorer.get_model = _load_encoder  # the scorer's own name for it: no path decides the class
    scorer = BERTScorer(model_type=model, num_layers=num_layers, batch_size=batch_size,
                        device=str(resolve_device(device, "features.encoder.device")))
    scorer._tokenizer = _SpecialTokens(scorer._tokenizer)
    return scorer


def bertscore_matrix(records: Sequence[Mapping[str, Any]], encoder: Mapping[str, Any], chunk: int = 32) -> np.ndarray:
    """[N, L-1] BERTScore F1 of every layer string against the record's final output.

    Pairs of ``chunk`` examples go to bert-score in one call; it deduplicates the strings
    of a call, so each example's y is encoded once for its L-1 pairs.
    """
    scorer = make_scorer(encoder)
    rows = []
    for lo in tqdm(range(0, len(records), chunk), desc="BERTScore", unit="chunk"):
        block = records[lo:lo + chunk]
        cands = [s for r in block for s in r["layer_strings"]]
        refs = [r["text"] for r in block for _ in r["layer_strings"]]
        f1 = scorer.score(cands, refs)[2].numpy() if cands else np.zeros(0)
        rows.append(f1.reshape(len(block), -1))
    return np.concatenate(rows).astype(np.float64)


def encoder_id(encoder: Mapping[str, Any]) -> str:
    """What identifies the encoder in a cache key (its path or hub id, and the layer used)."""
    return f"{encoder.get('model') or Path(default_model_path()).name}:{encoder['num_layers']}"


def _cache_path(stage: StageOutput, features_cache: Path, encoder: Mapping[str, Any]) -> Path:
    return features_cache / f"{stage.key}-bertscore-{stable_hash(encoder_id(encoder))}.npz"


def warm_bertscores(stages: Sequence[StageOutput], features_cache: Path, encoder: Mapping[str, Any]) -> int:
    """Fill the BERTScore caches of many stage outputs at once, each distinct (layer strings, text) pair scored once:
    many agents' judged records share most of their calls (a right call is the same call, judged the same way),
    so 19 agents' 11,259 judged STE calls hold 4,544 distinct ones. Returns the number of pairs scored."""
    todo = [s for s in stages if read_intact(_cache_path(s, features_cache, encoder), read_npz) is None]
    rows: dict[tuple, int] = {}
    unique = []
    for stage in todo:
        for record in stage.records:
            key = (record["text"], tuple(record["layer_strings"]))
            if key not in rows:
                rows[key] = len(unique)
                unique.append(record)
    scores = bertscore_matrix(unique, encoder) if unique else np.zeros((0, 0))
    for stage in todo:
        index = [rows[(r["text"], tuple(r["layer_strings"]))] for r in stage.records]
        path = _cache_path(stage, features_cache, encoder)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, {"ids": np.array([r["id"] for r in stage.records]), "f1": scores[index]})
    return len(unique)


def cached_bertscore(stage: StageOutput, features_cache: Path | None, encoder: Mapping[str, Any]) -> np.ndarray:
    """BERTScores for one LLM-stage output, computed once per encoder and shared by every job
    (``features_cache=None``: computed, not cached, as the gate does for one batch of queries)."""
    records = stage.records
    if features_cache is None:
        return bertscore_matrix(records, encoder)
    path = _cache_path(stage, features_cache, encoder)
    stored = read_intact(path, read_npz)  # a damaged file is set aside and recomputed
    if stored is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            stored = read_intact(path, read_npz)  # another job may have computed it meanwhile
            if stored is None:
                stored = {"ids": np.array([r["id"] for r in records]), "f1": bertscore_matrix(records, encoder)}
                write_npz(path, stored)
    if list(stored["ids"]) != [r["id"] for r in records]:
        raise UserError(f"{path} does not match the LLM-stage records; delete it to recompute")
    return stored["f1"]
