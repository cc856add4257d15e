"""A minimal tool-using agent behind the gate: the openai client against `mice-exp serve`, two of STE's tools
(add_date, run for real; get_weather_today, a mocked body), a few queries with their right calls.

For each query the agent runs the call the gate lets through and shows the question the gate asks instead of
a call it holds; at the end, the utility of the gate's decisions at its risk setting against executing every
call (a right call executed earns tp, a wrong one costs fp; see the MICE paper's ETCU).

    mice-exp serve model=GATE port=8000 &
    python experiments/gate/agent.py [--base-url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from typing import Any, Callable

import openai


def add_date(date: str, days: int) -> str:
    return (dt.date.fromisoformat(date) + dt.timedelta(days=int(days))).isoformat()


def get_weather_today(location: str) -> str:
    return f"sunny, 21 C in {location}"  # a mocked body: the call, not the weather, is what the gate judges


def function(name: str, description: str, **arguments: str) -> dict[str, Any]:
    """A tool as OpenAI's function schema (every argument required, typed: STE's own form of these tools)."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {a: {"type": t} for a, t in arguments.items()}, "required": list(arguments)}}}


TOOLS = [function("add_date", "Add days to a date. Date should be pass as 'yyyy-mm-dd'..", date="string",
                  days="integer"),
         function("get_weather_today", "Get today's the weather.", location="string")]
RUN: dict[str, Callable[..., str]] = {"add_date": add_date, "get_weather_today": get_weather_today}
#: Queries with the call that answers them.
QUERIES = [
    ("What is the date 90 days from 2022-10-14?", {"name": "add_date", "arguments": {"date": "2022-10-14", "days": 90}}),
    ("How is the weather in Paris today?", {"name": "get_weather_today", "arguments": {"location": "Paris"}}),
    ("Which date comes 3 weeks after 2023-01-31?", {"name": "add_date", "arguments": {"date": "2023-01-31", "days": 21}}),
    ("Is it raining in Tokyo right now?", {"name": "get_weather_today", "arguments": {"location": "Tokyo"}}),
    ("I need the date one hundred days after Christmas 2021.",
     {"name": "add_date", "arguments": {"date": "2021-12-25", "days": 100}}),
]
# The gate's risk setting "medium": a right call executed earns 1, a wrong one costs 1, holding one is 0.
TP, FP = 1.0, -1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600)
    model = client.models.list().data[0].id
    print(f"agent: {model} at {args.base_url}")
    gated = everything = 0.0
    start = time.perf_counter()
    for query, right in QUERIES:
        tick = time.perf_counter()
        response = client.chat.completions.create(model=model, messages=[{"role": "user", "content": query}],
                                                  tools=TOOLS)
        message, gate = response.choices[0].message, response.model_extra["mice_exp"]
        correct = gate["call"] == right
        print(f"\n{query}\n  call {json.dumps(gate['call'])}  p={gate['probability']:.2f} (tau {gate['tau']:g})  "
              f"{'right' if correct else 'wrong'} call  [{time.perf_counter() - tick:.0f} s]")
        if gate["call"] is not None:  # executing everything would run it
            everything += TP if correct else FP
        if message.tool_calls:
            call = message.tool_calls[0].function
            print(f"  executed -> {RUN[call.name](**json.loads(call.arguments))}")
            gated += TP if correct else FP
        elif gate["action"] == "no_call":
            print(f"  no call ({gate['parse_error']})")
        else:
            print(f"  held ({gate['action']}): {message.content}")
    print(f"\nutility (right +{TP:g}, wrong {FP:g}, held 0) over {len(QUERIES)} queries: gate {gated:+g}, "
          f"execute every call {everything:+g}; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
