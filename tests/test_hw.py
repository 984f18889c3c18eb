"""Machine facts off Linux: with /proc/cpuinfo unavailable (and os.sysconf gone, as on Windows),
the CPU name, flags, memory and the AMX guard come from each platform's own source, or degrade
to "unknown" without an error. The Linux path itself is covered in test_reliability_cli.py."""
from __future__ import annotations

import os

import pytest

from cactus_gguf.llama import hw


@pytest.fixture
def no_proc(monkeypatch, tmp_path):
    """The Linux path disabled: /proc/cpuinfo is not there."""
    monkeypatch.setattr(hw, "_CPUINFO", str(tmp_path / "no-cpuinfo"))


MAC_SYSCTL = {"machdep.cpu.brand_string": "Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz",
              "machdep.cpu.features": "FPU VME SSE3 AVX1.0 FMA",
              "machdep.cpu.leaf7_features": "BMI1 AVX2 AVX512F AVX512VNNI"}


def test_macos_reads_sysctl(no_proc, monkeypatch):
    monkeypatch.setattr(hw.sys, "platform", "darwin")
    monkeypatch.setattr(hw, "_sysctl", MAC_SYSCTL.get)
    assert hw._cpu_name() == MAC_SYSCTL["machdep.cpu.brand_string"]
    facts = hw.machine_facts()
    assert facts["simd"] == ["avx2", "avx512f", "avx512_vnni"]
    assert hw.cpu_has_amx() is False


def test_apple_silicon_reports_neon(no_proc, monkeypatch):
    monkeypatch.setattr(hw.sys, "platform", "darwin")
    monkeypatch.setattr(hw, "_sysctl", {"hw.optional.neon": "1",
                                        "machdep.cpu.brand_string": "Apple M2"}.get)
    assert hw._cpu_flags() == ["neon"] and hw._cpu_name() == "Apple M2"


def test_windows_asks_the_os(no_proc, monkeypatch):
    monkeypatch.setattr(hw.sys, "platform", "win32")
    monkeypatch.setattr(hw, "_windows_cpu_flags", lambda: ["avx2", "avx512f"])
    monkeypatch.setattr(hw, "_windows_cpu_name", lambda: "AMD Ryzen 7 7840U")
    monkeypatch.delattr(os, "sysconf")  # Windows has none
    monkeypatch.setattr(hw, "_windows_memory", lambda: 16 * 2**30)
    facts = hw.machine_facts()
    assert facts["cpu"] == "AMD Ryzen 7 7840U"
    assert facts["simd"] == ["avx2", "avx512f"]
    assert facts["memory_bytes"] == 16 * 2**30
    assert hw.cpu_has_amx() is False


@pytest.mark.parametrize("machine,flags", [("aarch64", ["neon"]), ("arm64", ["neon"]),
                                          ("x86_64", [])])
def test_other_systems_fall_back_to_the_architecture(no_proc, monkeypatch, machine, flags):
    monkeypatch.setattr(hw.sys, "platform", "freebsd14")
    monkeypatch.setattr(hw.platform, "machine", lambda: machine)
    assert hw._cpu_flags() == flags


def test_the_real_fallbacks_never_raise_here(no_proc, monkeypatch):
    """The Windows and sysctl probes run for real on this (Linux) machine and report nothing."""
    assert hw._windows_cpu_flags() == []
    assert hw._windows_cpu_name() is None
    assert hw._windows_memory() is None
    assert hw._sysctl("machdep.cpu.brand_string") is None
    monkeypatch.delattr(os, "sysconf")
    facts = hw.machine_facts()
    assert isinstance(facts["cpu"], str) and facts["cpu"]
    assert facts["memory_bytes"] is None and isinstance(facts["simd"], list)
