"""The memory warning before an LLM batch: foretold from the last batch's peak, silent while it fits."""

from __future__ import annotations

from pathlib import Path

from mice_exp.llm.headroom import GIB, Headroom, _cgroup_available, _meminfo_available, available_bytes


def machine(peak_gib: float, resident_gib: float, available_gib: float) -> Headroom:
    """A Headroom reading fixed figures instead of this process's (the model loaded at 1 GiB)."""
    headroom = Headroom(available=lambda: int(available_gib * GIB), resident=lambda: int(resident_gib * GIB),
                        peak=lambda: int(peak_gib * GIB))
    headroom.loaded = GIB
    return headroom


def test_nothing_is_foretold_before_the_first_batch_has_run():
    assert machine(peak_gib=1, resident_gib=1, available_gib=0.1).warning(8, 6000) is None


def test_a_batch_twice_as_long_is_foretold_at_four_times_the_last_growth():
    headroom = machine(peak_gib=3, resident_gib=3, available_gib=100)
    headroom.done(1000)
    assert headroom.expected_peak(2000) == 9 * GIB  # 1 GiB loaded + 2 GiB grown x (2000 / 1000)^2
    assert headroom.expected_peak(500) == 3 * GIB  # a shorter batch is foretold at the last peak


def test_it_warns_only_when_the_foretold_peak_exceeds_what_is_within_reach():
    fits = machine(peak_gib=3, resident_gib=3, available_gib=6.5)
    fits.done(1000)
    assert fits.warning(8, 2000) is None  # needs 9 GiB, 3 + 6.5 within reach
    short = machine(peak_gib=3, resident_gib=3, available_gib=5)
    short.done(1000)
    line = short.warning(8, 2000)
    assert line is not None and "\n" not in line
    assert "8 prompts of up to 2,000 tokens" in line and "9.0 GiB" in line and "8.0 GiB" in line
    assert "llm.batch_size" in line and "resumes" in line


def test_unknown_memory_figures_never_warn():
    headroom = Headroom(available=lambda: None, resident=lambda: 0, peak=lambda: 50 * GIB)
    headroom.done(10)
    assert headroom.warning(8, 6000) is None


def test_available_memory_is_capped_by_a_cgroup_limit(tmp_path: Path):
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text(str(3 * GIB))
    assert _cgroup_available(tmp_path) == GIB
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_available(tmp_path) is None
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:  2048 kB\n")
    assert _meminfo_available(tmp_path / "meminfo") == 2048 * 1024
    assert available_bytes() is None or available_bytes() > 0
