"""An ADK model for deterministic host tests: a ``BaseLlm`` that replies from a script instead of a model.

Step ``i`` of the script answers a request holding the results of ``i`` calls (a call that waited for a Tool
Confirmation has two, counted once; ADK's own confirmation parts not at all): ``("call", name, arguments)`` proposes that call, ``("answer", text)`` ends the agent's loop. Every
request is kept in ``requests``.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import Field


class ScriptedLlm(BaseLlm):
    script: list[tuple[Any, ...]]
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        done = len({p.function_response.id for c in llm_request.contents for p in c.parts or []
                    if p.function_response is not None and not p.function_response.name.startswith("adk_")})
        step = self.script[done]
        part = types.Part(text=step[1]) if step[0] == "answer" else types.Part(
            function_call=types.FunctionCall(id=f"call_{done}", name=step[1], args=step[2]))
        yield LlmResponse(content=types.Content(role="model", parts=[part]))
