"""Load a causal LM and expose the parts the logit lens needs (layers, final norm, unembedding)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from filelock import FileLock

from mice_exp.cache import stable_hash
from mice_exp.devices import resolve_device
from mice_exp.errors import UserError
from mice_exp.llm.assets import converted_dir
from mice_exp.llm.memory import keep_freed_memory
from mice_exp.llm.settings import LLMSettings
from mice_exp.loading import load_checked

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Unit roundoffs: bf16 keeps 8 significant bits, float32 24 (rounding to nearest).
_BF16_U, _F32_U = 2.0**-8, 2.0**-24
#: Tokens whose bf16 logits are screened as one group (their maximum first, their members only where it passes).
SCREEN_GROUP = 64
#: The bf16 GEMM's output rounding, relative to the rounded logit: u / (1 - u), 1% on top.
_OUT_U = _BF16_U / (1 - _BF16_U) * 1.01


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16): there the screened lens is ~2.4x the
    float32 one (``benchmarks/lens_screen.py``); elsewhere bf16 is emulated and slower."""
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def screen_bound(normed: torch.Tensor, column_max: torch.Tensor) -> torch.Tensor:
    """Per row, B0 in |bf16 logit - float32 logit| <= B0 + :data:`_OUT_U` |bf16 logit|, for every token at once:
    both factors rounded to bf16 (2u + u^2 of each product), both sums accumulated in float32 (within gamma_d of
    sum |x_i w_i| each, Higham 3.5) and sum_i |x_i w_ji| <= sum_i |x_i| max_j |w_ji|; the bf16 GEMM's output
    rounding is the second term. 1% on top for the rounding of the bound itself."""
    d = normed.shape[-1]
    u, gamma = _BF16_U, d * _F32_U / (1 - d * _F32_U)
    return (2 * u + u**2 + 2 * gamma * (1 + u) ** 2) * 1.01 * (normed.abs() @ column_max)


@torch.no_grad()
def bf16_screen(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`screened_argmax` screens with: the weight in bf16, zero rows up to a multiple of
    :data:`SCREEN_GROUP`, transposed ([d, |V|]: 1.25x faster a GEMM than [|V|, d] on a 2-core Xeon), and each
    hidden dimension's largest |weight|."""
    low = torch.nn.functional.pad(weight.to(torch.bfloat16), (0, 0, 0, -weight.shape[0] % SCREEN_GROUP))
    return low.T.contiguous(), weight.abs().amax(dim=0)


def screened_argmax(normed: torch.Tensor, weight: torch.Tensor, screen: tuple[torch.Tensor, torch.Tensor],
                    post: Callable[[torch.Tensor], torch.Tensor], exact: Callable[[torch.Tensor], torch.Tensor],
                    rows: int = 256) -> torch.Tensor:
    """The first maximum of ``post(normed @ weight.T)`` per row, screened in bf16.

    Every token's bf16 logit A is within B = ``screen_bound`` + u|A| of its float32 one, so a token can win only
    if A + B reaches the best A - B of its row (~16 of 49k per row on SmolLM2's lens, found group by group of
    :data:`SCREEN_GROUP` tokens); those are computed in float32 and the first of the largest taken. A row whose
    left-out tokens are not provably below its winner (``post`` flattening them into a tie, non-finite states)
    is done by ``exact`` instead. ``screen``: :func:`bf16_screen` of ``weight``; ``rows`` at a time bound the
    bf16 logits' memory (and are the fastest size on a 2-core Xeon).
    """
    if normed.shape[0] > rows:
        return torch.cat([screened_argmax(normed[lo:lo + rows], weight, screen, post, exact, rows)
                          for lo in range(0, normed.shape[0], rows)])
    low, column_max = screen
    n, vocab = normed.shape[0], weight.shape[0]
    approx = normed.to(torch.bfloat16) @ low
    approx[:, vocab:] = -torch.inf  # the padding's zero rows are no tokens
    approx = approx.view(n, -1, SCREEN_GROUP)
    group_max = approx.amax(dim=-1).float()  # [n, groups]; A + u|A| + B0 grows with A: a group's best says it all
    top, bound = group_max.amax(dim=-1), screen_bound(normed, column_max)
    floor = top - _OUT_U * top.abs() - bound  # the row's best A - B: no float32 logit left out reaches it
    reach = floor - bound  # A + u|A| must reach this
    r, g = (group_max + _OUT_U * group_max.abs() >= reach[:, None]).nonzero(as_tuple=True)
    values = approx[r, g].float()
    p, k = (values + _OUT_U * values.abs() >= reach[r, None]).nonzero(as_tuple=True)
    r, c = r[p], g[p] * SCREEN_GROUP + k
    logits = post((normed[r] * weight[c]).sum(dim=-1))
    best = torch.full_like(top, -torch.inf).scatter_reduce(0, r, logits, "amax")
    at_best = logits == best[r]
    winner = torch.full((n,), vocab, device=top.device).scatter_reduce(0, r[at_best], c[at_best], "amin")
    unsure = ~(post(floor) < best)
    if unsure.any():
        winner[unsure] = exact(normed[unsure])
    return winner


@dataclass
class LLM:
    """A loaded model with handles on its decoder layers, final norm and unembedding."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    #: screen the logit lens in bf16 (:func:`screened_argmax`); None: where the CPU multiplies bf16 in hardware
    lens_screen: bool | None = None
    _screen_cache: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def cache_arg(self) -> str:
        """The name the installed transformers gives the KV-cache argument: ``cache`` (5.2x), ``past_key_values``
        before (vLLM's CPU build pins transformers below 5.20, and its venv runs the hf path too)."""
        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    @property
    def layers(self) -> Any:
        return self.model.get_decoder().layers

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    @property
    def final_norm(self) -> torch.nn.Module:
        return self.model.get_decoder().norm

    @property
    def softcap(self) -> float | None:
        """Gemma's final logit softcap, applied after the unembedding (None for most models)."""
        return getattr(self.model.config.get_text_config(), "final_logit_softcapping", None)

    def _normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm of ``hidden`` in the unembedding's dtype: states kept in float32 (a teacher-forced replay's,
        an engine's read-back) go back to the model's dtype, which is exact for states a bf16 model made."""
        return self.final_norm(hidden.to(self.model.get_output_embeddings().weight.dtype))

    def lens_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logit lens: the model's own final norm, unembedding and logit post-processing."""
        return self._post(self.model.get_output_embeddings()(self._normed(hidden)))

    def lens_argmax(self, hidden: torch.Tensor, block: int = 2048) -> torch.Tensor:
        """``lens_logits(hidden).argmax(-1)`` (the first maximum), over vocabulary blocks of ``block`` rows.

        A float32 unembedding on a CPU that multiplies bf16 in hardware is screened in bf16 first
        (:func:`screened_argmax`: 2.3x faster on a 2-core Xeon, the same tokens; it keeps a bf16 copy of the
        unembedding: 54 MiB for SmolLM2, 320 MiB for Gemma 3 270M); otherwise :meth:`blocked_argmax`.
        """
        normed = self._normed(hidden)
        head = self.model.get_output_embeddings()
        if self.lens_screen is None:
            self.lens_screen = native_bf16()
        if (self.lens_screen and normed.device.type == "cpu" and normed.dtype == torch.float32
                and head.bias is None):
            return screened_argmax(normed, head.weight, self._screen(head.weight), self._post,
                                   exact=lambda rows: self.blocked_argmax(rows, block))
        return self.blocked_argmax(normed, block)

    def blocked_argmax(self, normed: torch.Tensor, block: int = 2048) -> torch.Tensor:
        """The lens argmax of normed states, every logit computed in the unembedding's dtype.

        Each block's logits stay in cache instead of streaming a rows x |V| matrix through memory (1.3x
        faster on a 2-core AVX2 CPU); every logit is the same dot product as in the full GEMM, and an
        earlier block keeps a tie, so the result is argmax's (first maximum) exactly.
        """
        head = self.model.get_output_embeddings()
        best = arg = None
        for lo in range(0, head.weight.shape[0], block):
            bias = None if head.bias is None else head.bias[lo:lo + block]
            value, index = self._post(torch.nn.functional.linear(normed, head.weight[lo:lo + block], bias)).max(dim=-1)
            if best is None:
                best, arg = value, index
            else:
                better = value > best
                best, arg = torch.where(better, value, best), torch.where(better, index + lo, arg)
        return arg

    def _screen(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`bf16_screen` of the unembedding, made once per weight (a weight changed in place makes it again)."""
        key = (weight.data_ptr(), weight._version)
        if self._screen_cache is None or self._screen_cache[0] != key:
            self._screen_cache = (key, bf16_screen(weight))
        return self._screen_cache[1]

    def _post(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logit post-processing after the unembedding (Gemma's softcap)."""
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def eos_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids


def check_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise UserError(f"llm.dtype={name!r}; expected one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]


def _random_model(cfg: Mapping[str, Any], tokenizer: Any, device: torch.device = torch.device("cpu"),
                  dtype: torch.dtype = torch.float32) -> Any:
    """A random-weight model built from a config (tests and speed benchmarks), initialised where it runs
    (an 8B-shaped one is drawn on the GPU in bf16 in seconds; float32 on the CPU gives the same weights as ever)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(cfg["architecture"])
    model_type = arch.pop("model_type")
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **arch)
    torch.manual_seed(int(cfg.get("seed", 0)))
    with device:
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def model_folder(llm: LLMSettings, models_cache: Path) -> Path:
    """A local folder of weights, config and tokenizer for the ``conf/llm`` entry (what another engine loads):
    the converted GGUF, the pretrained path, or a random model saved once under ``models_cache``."""
    source = llm.source
    if source["kind"] == "gguf_package":
        return converted_dir(source, models_cache)
    if source["kind"] == "pretrained":
        return Path(source["path"])
    target = models_cache / f"random-{stable_hash(dict(source), 10)}"
    models_cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            tokenizer = load_tokenizer(source, models_cache)
            partial = target.with_name(target.name + ".partial")
            _random_model(source, tokenizer).save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            partial.replace(target)
    return target


def load_tokenizer(source: Mapping[str, Any], models_cache: Path) -> Any:
    """The tokenizer of a ``conf/llm`` source, left-padded with a pad token (what every backend builds prompts with)."""
    from transformers import AutoTokenizer

    kind = source["kind"]
    if kind not in ("gguf_package", "pretrained", "random"):
        raise UserError(f"llm.source.kind={kind!r}; expected gguf_package, pretrained or random")
    if kind == "pretrained":
        folder = source["path"]
    else:  # a random model borrows a packaged model's tokenizer
        folder = converted_dir(source["tokenizer"] if kind == "random" else source, models_cache)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except OSError as error:
        raise UserError(f"llm.source.path={folder!r} could not be loaded ({error.__class__.__name__}); "
                        "expected a local model folder or a hub id whose weights are present") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_hf(llm: LLMSettings, models_cache: Path) -> LLM:
    """Build the model described by a ``conf/llm`` entry (packaged GGUF, hub id / path, or random)."""
    from transformers import AutoModelForCausalLM

    keep_freed_memory()  # the forwards' large activations reuse freed heap memory instead of faulting in pages
    source = llm.source
    dtype = check_dtype(llm.resolved_dtype)
    device = resolve_device(llm.device)
    tokenizer = load_tokenizer(source, models_cache)
    if source["kind"] == "random":
        model = _random_model(source, tokenizer, device, dtype)
    else:
        folder = model_folder(llm, models_cache)
        try:
            model = load_checked(AutoModelForCausalLM, folder, "llm.source", allow=(), dtype=dtype)
        except OSError as error:
            raise UserError(f"llm.source.path={str(folder)!r} could not be loaded ({error.__class__.__name__}); "
                            "expected a local model folder or a hub id whose weights are present") from None
    model.to(device).eval()
    return LLM(model=model, tokenizer=tokenizer, name=llm.name, device=device)
