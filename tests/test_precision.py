"""llm.dtype=auto never picks bf16 on a CPU, and bf16 where the CPU only emulates it is warned about."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mice_exp.errors import UserError
from mice_exp.llm import precision
from mice_exp.llm.precision import cpu_flags, resolve_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16\n"


def fake_cpu(monkeypatch, tmp_path: Path, cpuinfo: str) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(precision, "cpu_flags", lambda: cpu_flags(path))


@pytest.mark.parametrize("cpuinfo", [AVX2_ONLY, AVX512_BF16])
def test_auto_is_float32_on_every_cpu(monkeypatch, tmp_path, cpuinfo):
    fake_cpu(monkeypatch, tmp_path, cpuinfo)
    assert resolve_dtype("auto", "cpu") == "float32"


def test_bf16_on_an_avx2_only_cpu_is_warned_about_in_one_line(monkeypatch, tmp_path, caplog):
    fake_cpu(monkeypatch, tmp_path, AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="mice_exp.llm.precision"):
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    (record,) = caplog.records
    assert "several times slower" in record.getMessage() and "\n" not in record.getMessage()


def test_bf16_on_a_cpu_with_native_bf16_is_a_quiet_choice(monkeypatch, tmp_path, caplog):
    fake_cpu(monkeypatch, tmp_path, AVX512_BF16)
    with caplog.at_level(logging.WARNING, logger="mice_exp.llm.precision"):
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert not caplog.records


def test_an_unknown_dtype_is_one_line():
    with pytest.raises(UserError, match="llm.dtype='fp8'; expected one of auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_auto_and_float32_share_one_llm_stage_cache():
    from mice_exp.compose import as_plain, compose_config
    from mice_exp.data import Selection
    from tests.conftest import stage_of

    key = {d: stage_of(as_plain(compose_config([f"llm.dtype={d}"])), selection=Selection([], {})).key("cpu")
           for d in ("auto", "float32", "bfloat16")}
    assert key["auto"] == key["float32"] != key["bfloat16"]
