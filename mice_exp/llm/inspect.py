"""A look inside one example: the string each layer decodes to (MICE Figure 2)."""

from __future__ import annotations

from typing import Any

from mice_exp.errors import UserError
from mice_exp.llm.stage import LLMStage


def _find(records: list[dict[str, Any]], target: str) -> dict[str, Any]:
    by_id = {r["id"]: r for r in records}
    if target in by_id:
        return by_id[target]
    if target.isdigit() and int(target) < len(records):
        return sorted(records, key=lambda r: r["id"])[int(target)]
    raise UserError(f"example {target!r} is not in the LLM-stage cache; expected an id such as "
                    f"{sorted(by_id)[0]!r} or an index below {len(records)}")


def layer_table(stage: LLMStage, target: str, width: int = 160) -> str:
    """Layer number and decoded string for every layer of one example of the LLM stage, the final output last."""
    record = _find(stage.output().records, target)
    strings = record["layer_strings"] + [record["text"]]
    lines = [f"example {record['id']} ({'correct' if record['label'] else 'incorrect'}, "
             f"raw confidence {record['raw_confidence']:.3f})", f"{'layer':>5}  string"]
    for layer, text in enumerate(strings, start=1):
        shown = text.replace("\n", "\\n")
        lines.append(f"{layer:>5}  {shown[:width] + ('...' if len(shown) > width else '')}")
    return "\n".join(lines)
