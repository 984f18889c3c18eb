"""Machine facts: off Linux, with /proc/cpuinfo unavailable (and os.sysconf gone, as on Windows),
the CPU name, flags, memory and the AMX guard come from each platform's own source, or degrade
to "unknown" without an error; on Linux, the AMX guard (llama.cpp issue #20824: weight repacking
off exactly when the CPU and the build both have AMX) reads /proc/cpuinfo and the build's system
info, and its choice reaches llama.cpp."""
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


# ---- Linux: /proc/cpuinfo, the build's system info, the AMX guard (llama.cpp issue #20824) ------

@pytest.mark.parametrize("cpu,build,expected", [(True, True, False), (True, False, True),
                                                (False, True, True), (False, False, True)])
def test_repacking_is_off_exactly_when_cpu_and_build_have_amx(monkeypatch, cpu, build, expected):
    from cactus_gguf.llama import ModelOptions, model

    monkeypatch.setattr(model, "cpu_has_amx", lambda: cpu)
    monkeypatch.setattr(model, "build_has_amx", lambda: build)
    assert ModelOptions().resolved_repack() is expected
    # an explicit choice wins
    assert ModelOptions(repack=True).resolved_repack() is True
    assert ModelOptions(repack=False).resolved_repack() is False


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx2 avx512f amx_bf16 amx_tile amx_int8 avx512_fp16", True),
    ("fpu avx2 avx512f amx_bf16 amx_tile", False),   # no AMX_INT8
    ("fpu avx2 amx_int8x", False),                   # a whole flag, not a substring
    (None, False),                                   # no flags line (e.g. ARM)
])
def test_cpu_amx_detection_reads_the_cpuinfo_flags(monkeypatch, tmp_path, flags, expected):
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                    + (f"flags\t\t: {flags}\n" if flags else "Features\t: fp asimd\n"))
    real_open = open
    monkeypatch.setattr(hw, "open",
                        lambda path, *a, **kw: real_open(fake if path == "/proc/cpuinfo" else path,
                                                         *a, **kw), raising=False)
    assert hw.cpu_has_amx() is expected


def test_cpu_amx_detection_survives_an_unreadable_cpuinfo(monkeypatch):
    def denied(*a, **kw):
        raise PermissionError("denied")

    monkeypatch.setattr(hw, "open", denied, raising=False)
    assert hw.cpu_has_amx() is False


def test_build_amx_detection_reads_the_system_info(monkeypatch):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_print_system_info",
                        lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert hw.build_has_amx() is True
    monkeypatch.setattr(llama_cpp, "llama_print_system_info",
                        lambda: b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")
    assert hw.build_has_amx() is False


def test_the_resolved_repack_choice_reaches_llama_cpp(tiny_pair, monkeypatch):
    from llama_cpp import _internals

    from cactus_gguf.llama import Context, ContextOptions, model

    seen = []
    real = _internals.LlamaModel.__init__

    def spy(self, *a, params, **kw):
        seen.append(bool(params.use_extra_bufts))
        real(self, *a, params=params, **kw)

    monkeypatch.setattr(_internals.LlamaModel, "__init__", spy)
    for cpu, build in ((True, True), (False, True)):
        monkeypatch.setattr(model, "cpu_has_amx", lambda: cpu)
        monkeypatch.setattr(model, "build_has_amx", lambda: build)
        Context.load(tiny_pair[0], context_options=ContextOptions(n_ctx=256, n_threads=1)).close()
    assert seen == [False, True]
