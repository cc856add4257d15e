"""vLLM's hidden-states connector, for the requests that want states, and writing from host memory on a CPU.

vLLM 0.32's ``ExampleHiddenStatesConnector`` writes every finished request's states to disk: a confidence
source's request (P(True), a greedy follow-up, k samples) wants none, and one 1,200-token prompt's states of
every layer are ~90 MB. A request whose ``kv_transfer_params`` holds ``{NO_STATES: True}`` is left out here.

On a CPU the parent copies each request's states out of its cache through a CUDA stream into pinned memory; a
CPU build has neither, and fails at the first request. There the same slots are read from the (host) cache and
written at once; the lock file and the finished-sending report are the parent's. Loaded by vLLM's worker and
scheduler from ``kv_connector_module_path``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)

from mice_exp.llm.backends.vllm import NO_STATES


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


class _Written:
    """What the parent polls for a request's copy: already complete."""

    @staticmethod
    def query() -> bool:
        return True


class HostHiddenStatesConnector(SelectiveHiddenStatesConnector):
    """The selective connector with its copy and write done synchronously in host memory."""

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
