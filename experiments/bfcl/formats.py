"""prompt=ste against prompt=json_tools on the same calls (BFCL's or STE's): accuracy, unparseable replies, prompt length.

    python experiments/bfcl/formats.py experiments/records/bfcl-live_simple-first64-<llm>-{ste,json_tools}.jsonl.gz ...

Records files are paired by LLM (the header's ``llm``); the two of a pair must hold the same calls. Per
file: accuracy with its 95% Wilson interval, replies with no parseable call, prompt tokens (mean, median,
largest); per pair: the calls right under one format only (an exact two-sided sign test on them says
whether the formats differ). Torch-free: reads the records only.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from math import comb
from pathlib import Path

import numpy as np

from mice_exp.llm.records import made_with, read_records_file, read_records_header
from mice_exp.metrics.calibration import wilson_interval

PRESETS = {"react": "ste", "tool_call": "json_tools"}  # conf/prompt: each preset's reply format


def sign_test(a: int, b: int) -> float:
    """Two-sided exact binomial p-value of ``a`` against ``b`` discordant pairs under p = 1/2."""
    n = a + b
    return 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(min(a, b) + 1)) / 2 ** n)


def row(path: Path) -> tuple[str, str, dict[str, int], list[str]]:
    header = read_records_header(path)
    prompt = PRESETS[made_with(header)["format"]]
    records = read_records_file(path, header["dataset"]).records
    labels = {r["id"]: int(r["label"]) for r in records}
    tokens = np.array([r["prompt_tokens"] for r in records])
    correct = sum(labels.values())
    low, high = wilson_interval(correct, len(records))
    unparseable = sum(r["parse_error"] is not None for r in records)
    line = (f"| {header.get('display', header['llm'])} | `{prompt}` | {len(records)} | {correct} | "
            f"{correct / len(records):.3f} [{low:.2f}, {high:.2f}] | {unparseable} | "
            f"{tokens.mean():,.0f} / {np.median(tokens):,.0f} / {tokens.max():,} |")
    return header["llm"], prompt, labels, [line]


def main(paths: list[str]) -> str:
    lines = ["| LLM | prompt | calls | correct | accuracy [95% Wilson] | unparseable | prompt tokens mean / median / max |",
             "|---|---|---:|---:|---|---:|---|"]
    by_llm: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for path in paths:
        llm, prompt, labels, out = row(Path(path))
        by_llm[llm][prompt] = labels
        lines += out
    for llm, formats in by_llm.items():
        if set(formats) != {"ste", "json_tools"}:
            continue
        ste, tools = formats["ste"], formats["json_tools"]
        if set(ste) != set(tools):
            raise SystemExit(f"{llm}: the two records files hold different calls")
        only_ste = sum(ste[i] and not tools[i] for i in ste)
        only_tools = sum(tools[i] and not ste[i] for i in ste)
        lines.append(f"\n{llm}: right under ste only {only_ste}, under json_tools only {only_tools} "
                     f"(exact sign test p = {sign_test(only_ste, only_tools):.3f}); both {sum(ste[i] and tools[i] for i in ste)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
