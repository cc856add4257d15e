"""The batching service: checked requests in, OpenAI's bodies out, the gate's LLM one batch at a time.

Requests that wait together run as one gate batch (up to ``batch_size``; :class:`Batcher`); more than
``max_queue`` waiting ones are refused (:class:`Busy`, HTTP 429). :class:`ChatService` is every endpoint
apart from HTTP (:mod:`mice_exp.gate.app` serves it).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from mice_exp.gate.chat import Decision, InvalidRequest, chat_example, read_call
from mice_exp.gate.gate import Gate
from mice_exp.gate.policy import ToolRisk, at_tau, check_on_abstain, held_call, verdict, written
from mice_exp.gate.protocol import ChatRequest, chat_request, check_model, completion, gate_options
from mice_exp.llm.memory import trim_heap

class Busy(Exception):
    """The queue is full (HTTP 429)."""


class Batcher:
    """Requests waiting for the LLM, run together: whatever waits when the LLM frees up (up to ``batch_size``)
    goes to ``run`` as one batch, on ``executor`` (one thread: one batch at a time on the LLM). ``run`` returns,
    per item, its result or the exception that refuses it. ``idle`` runs on the executor whenever the queue
    drains (the server hands the heap's free pages back then: :func:`mice_exp.llm.memory.trim_heap`)."""

    def __init__(self, run: Callable[[list[Any]], list[Any]], executor: ThreadPoolExecutor, max_queue: int,
                 batch_size: int, idle: Callable[[], Any] | None = None) -> None:
        self.run, self.executor, self.max_queue, self.batch_size = run, executor, max_queue, batch_size
        self.idle = idle
        self.pending = 0  # requests waiting or running
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._wake: asyncio.Event | None = None

    async def submit(self, item: Any) -> Any:
        if self._wake is None:
            raise RuntimeError("the batcher is not running")
        if self.pending >= self.max_queue:
            raise Busy
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self.pending += 1
        self._wake.set()
        try:
            return await future
        finally:
            self.pending -= 1

    async def submit_many(self, items: list[Any]) -> list[Any]:
        """Several items of one request (in one batch where they fit), refused together when the queue is full."""
        if self.pending + len(items) > self.max_queue:
            raise Busy
        return list(await asyncio.gather(*(self.submit(i) for i in items)))

    async def serve(self) -> None:
        """The batch loop (a task of the server's event loop)."""
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch = [(i, f) for i, f in self._waiting[:self.batch_size] if not f.done()]
                del self._waiting[:self.batch_size]
                if not batch:
                    continue
                try:
                    results = await loop.run_in_executor(self.executor, self.run, [i for i, _ in batch])
                except Exception as error:  # noqa: BLE001 - every request of the batch gets it
                    results = [error] * len(batch)
                for (_, future), result in zip(batch, results):
                    if not future.done():
                        (future.set_exception if isinstance(result, BaseException) else future.set_result)(result)
            if self.idle is not None:
                await loop.run_in_executor(self.executor, self.idle)


def _each(run: Callable[[list[Any]], list[Any]], items: list[Any]) -> list[Any]:
    """``run`` on a batch; where the batch is refused (one request's prompt too long), on each item alone, so
    the refusal reaches that request only."""
    try:
        return run(items)
    except Exception as error:  # noqa: BLE001 - handed to the request(s) it concerns
        if len(items) == 1:
            return [error]
    out = []
    for item in items:
        try:
            out += run([item])
        except Exception as error:  # noqa: BLE001
            out.append(error)
    return out


class ChatService:
    """The endpoints apart from HTTP: checked requests in, OpenAI's bodies out (one per gate)."""

    def __init__(self, gate: Gate, model: str, on_abstain: str = "confirm", max_queue: int = 64,
                 batch_size: int | None = None, risk: ToolRisk | None = None) -> None:
        self.gate, self.model = gate, model
        self.on_abstain = check_on_abstain(on_abstain)
        self.created = int(time.time())
        self.risk = risk or ToolRisk()
        self.schemas = gate.prompt_settings.schemas
        size = int(batch_size or gate.llm_settings.batch_size)
        executor = ThreadPoolExecutor(1, thread_name_prefix="gate")  # the LLM runs one batch at a time
        # the LLM keeps what its forwards free (keep_freed_memory: faster batches back to back); idle, it is handed back
        self.chats = Batcher(lambda items: _each(self._check, items), executor, max_queue, size, idle=trim_heap)
        self.judged = Batcher(lambda items: _each(self._score, items), executor, max_queue, size, idle=trim_heap)

    @property
    def pending(self) -> int:
        return self.chats.pending + self.judged.pending

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_entry()]}

    def model_entry(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "mice_exp"}

    # ------------------------------------------------------------------ the LLM side (the executor's thread)
    def _check(self, items: list[ChatRequest]) -> list[Decision]:
        decisions = self.gate.check_batch([(r.messages, r.tools) for r in items])
        return [d if r.tau is None else at_tau(d, r.tau) for r, d in zip(items, decisions)]

    def _score(self, items: list[tuple[Any, Any, Any]]) -> list[Decision]:
        return self.gate.score_batch(items)

    # ------------------------------------------------------------------ requests
    def chat_request(self, request: Mapping[str, Any]) -> ChatRequest:
        """The request checked for this gate (:func:`mice_exp.gate.protocol.chat_request`)."""
        return chat_request(request, model=self.model, on_abstain=self.on_abstain, schemas=self.schemas,
                            max_new_tokens=int(self.gate.llm_settings.max_new_tokens))

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """``POST /v1/chat/completions`` on a checked request: a held call the user approves, or the gate's answer."""
        approved = held_call(request.messages) if request.on_abstain == "confirm" else None
        offered = {t["function"]["name"] for t in request.tools}
        if approved is not None and approved[0].name in offered:
            call, p = approved
            decision = Decision(call=call, probability=p, arguments={}, execute=True,
                                tau=self.gate.tau if request.tau is None else request.tau, text=written(call),
                                parse_error=None, prompt_tokens=0, completion_tokens=0)
            return completion(decision, self.model, request.on_abstain, approved=True)
        decision = await self.chats.submit(request)
        if request.required and decision.call is None:
            raise InvalidRequest(f"tool_choice asks for a call, but the gate's LLM replied without a call to "
                                 f"{' or '.join(sorted(offered))} ({decision.parse_error}); expected tool_choice auto "
                                 "to get its text", param="tool_choice", code="tool_choice_unmet", status=422)
        return completion(decision, self.model, request.on_abstain)

    async def check_calls(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/tool_calls/check``: each proposed call's probability, per-argument probabilities and
        decision at its tool's risk (``mice_exp.tau`` decides every call at one threshold instead)."""
        check_model(request, self.model, required=False)
        unknown = [k for k in request if k not in ("model", "messages", "tools", "tool_calls", "mice_exp")]
        if unknown:
            raise InvalidRequest(f"Unrecognized request argument supplied: {unknown[0]}; expected model, messages, "
                                 "tools, tool_calls and mice_exp", param=unknown[0], code="unknown_parameter")
        messages, tools, calls = request.get("messages"), request.get("tools"), request.get("tool_calls")
        chat_example(messages, tools, 0, self.schemas)
        if not isinstance(calls, list) or not calls:
            raise InvalidRequest("'tool_calls' must be a non-empty list of the calls to judge, in OpenAI's shape "
                                 '{"id", "type": "function", "function": {"name", "arguments"}}', param="tool_calls")
        names = [read_call(c, f"tool_calls[{i}]")[0] for i, c in enumerate(calls)]  # a malformed call: refused here
        options = gate_options(request)
        by_name = {t["function"]["name"]: t for t in tools}
        decisions = await self.judged.submit_many([(messages, tools, c) for c in calls])
        results = []
        for i, (name, call, decision) in enumerate(zip(names, calls, decisions)):
            ident = call.get("id") if isinstance(call.get("id"), str) else None
            if "tau" in options:
                tau, source = options["tau"], "request"
            elif name in by_name:
                tau, source = self.risk.tau(by_name[name], self.gate.tau)
            else:
                tau, source = self.gate.tau, "gate"
            results.append(verdict(decision, i, ident, name, tau, source, self.risk.low))
        return {"object": "tool_calls.check", "model": self.model, "results": results}
