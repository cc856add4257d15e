"""vLLM's hidden-states connector, for the requests that want states, and writing from host memory on a CPU.

vLLM 0.32's ``ExampleHiddenStatesConnector`` writes every finished request's states to disk: a confidence
source's request (P(True), a greedy follow-up, k samples) wants none, and one 1,200-token prompt's states of
every layer are ~90 MB. A request whose ``kv_transfer_params`` holds ``{NO_STATES: True}`` is left out here, and one
holding ``{TAIL: N}`` gets the states of its last N positions only (from the start of the block they begin in),
which is all a stage's generation or a teacher-forced reply reads.

On a CPU the parent copies each request's states out of its cache through a CUDA stream into pinned memory; a
CPU build has neither, and fails at the first request. There the same slots are read from the (host) cache and
written at once; the lock file and the finished-sending report are the parent's. Loaded by vLLM's worker and
scheduler from ``kv_connector_module_path``.

On a CPU the connector also mends one vLLM kernel its engine runs (:func:`mend_cpu_expand`): without it, every
sample drawn at a temperature above 0 beside ``extract_hidden_states`` is wrong.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)

from mice_exp.llm.backends.vllm import NO_STATES, TAIL


class SelectiveHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The parent connector, but a request asking :data:`~mice_exp.llm.backends.vllm.NO_STATES` gets no file:
    without a file name the parent neither locks nor saves it, and frees its blocks at once."""

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args if new.sampling_params else None) or {}
            if (extra.get("kv_transfer_params") or {}).get(NO_STATES):
                meta.new_req_filenames.pop(new.req_id, None)
                self._request_filenames.pop(new.req_id, None)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """The parent's save, cut to a :data:`~mice_exp.llm.backends.vllm.TAIL`: the worker reads a save's positions
        from the start of its first block, so whole blocks before the tail's go, with their tokens."""
        delay, params = super().request_finished(request, block_ids)
        tail = (request.kv_transfer_params or {}).get(TAIL)
        pending = self._pending_saves.get(request.request_id)
        if tail and pending is not None:
            first = max(pending.token_ids.shape[0] - int(tail), 0) // self._block_size
            pending.token_ids = pending.token_ids[first * self._block_size:]
            pending.block_ids = pending.block_ids[first:]
        return delay, params


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """Each request's value repeated over its draft tokens (``cu_num_tokens``: their running count), ``replace_from``
    replaced by ``replace_to``: what vLLM's ``expand_kernel`` computes, in any dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def mend_cpu_expand() -> bool:
    """Replace the rejection sampler's ``expand_batch_to_tokens`` where the installed one gets a float case wrong;
    True if it did.

    vLLM 0.32's CPU override of ``expand_kernel`` (``vllm.utils.cpu_triton_utils._expand_kernel_impl``) writes into
    an int64 copy of its output, so the float output stays uninitialised memory. Under speculative decoding, which
    ``extract_hidden_states`` is, the rejection sampler divides each token's logits by that expanded temperature:
    at T = 1 SmolLM2's samples came out as the least likely tokens of the vocabulary or one token repeated (mean
    log-likelihood -7.5 against -2.3 on a plain engine), while greedy requests, which never read it, were right.
    A vLLM that expands correctly is left alone."""
    from vllm.v1.sample import rejection_sampler

    values, cumulative = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1, 3, 4], dtype=torch.int32)
    want = torch.tensor([0.5, 1.0, 1.0, 2.0])
    if torch.equal(rejection_sampler.expand_batch_to_tokens(values, cumulative, 4, -1, 1), want):
        return False
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True


class _Written:
    """What the parent polls for a request's copy: already complete."""

    @staticmethod
    def query() -> bool:
        return True


class HostHiddenStatesConnector(SelectiveHiddenStatesConnector):
    """The selective connector with its copy and write done synchronously in host memory. The worker's is made in
    the process that samples, after vLLM has put in its CPU kernels: there the sampler is mended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.role == KVConnectorRole.WORKER:
            mend_cpu_expand()

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size, dtype=torch.long)[None, :] + blocks[:, None] * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()}, pending.filename)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is not None:
            os.close(lock_fd)  # releases the reader waiting on the file's lock
        self._req_copy_events[pending.req_id] = _Written()
