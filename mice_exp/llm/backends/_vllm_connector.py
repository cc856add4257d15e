"""vLLM's hidden-states connector, writing from host memory (``llm.backend=vllm`` on a CPU).

vLLM 0.32's ``ExampleHiddenStatesConnector`` copies each finished request's states out of its cache through a
CUDA stream into pinned memory; a CPU build has neither, and fails at the first request. Here the same slots
are read from the (host) cache and written at once; the lock file and the finished-sending report are the
parent's. Loaded by vLLM's worker from ``kv_connector_module_path``.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)


class _Written:
    """What the parent polls for a request's copy: already complete."""

    @staticmethod
    def query() -> bool:
        return True


class HostHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The parent connector with its copy and write done synchronously in host memory."""

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
