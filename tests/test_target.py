import dataclasses
from pathlib import Path

import pytest

from tilecraft.errors import TargetError
from tilecraft.target import ISAS, Target, _isa_from_cpuinfo


def test_host_is_detected_from_this_machine():
    host = Target.host()
    assert host.kind == "llvm"
    assert host.isa in ISAS
    assert host.num_cores >= 1
    assert host.l1_bytes > 0 and host.l2_bytes > 0 and host.l3_bytes > 0
    assert host.cache_line_bytes > 0
    assert host.march == "native"


def test_host_detection_is_cached():
    assert Target.host() is Target.host()


@pytest.mark.parametrize("spec", [None, "llvm", "c", "cpu", "  llvm  ", {}])
def test_llvm_and_its_aliases_mean_the_host(spec):
    assert Target(spec) == Target.host()


@pytest.mark.parametrize("mcpu, isa, vector_bytes", [
    ("skylake-avx512", "avx512", 64), ("znver4", "avx512", 64), ("core-avx2", "avx2", 32), ("znver3", "avx2", 32),
])
def test_mcpu_sets_isa_vector_width_and_march(mcpu, isa, vector_bytes):
    target = Target(f"llvm -mcpu={mcpu}")
    assert (target.isa, target.vector_bytes, target.march) == (isa, vector_bytes, mcpu)


def test_unspecified_fields_come_from_the_host():
    target = Target("llvm -mcpu=skylake-avx512")
    host = Target.host()
    assert (target.num_cores, target.l1_bytes, target.l2_bytes, target.l3_bytes) == (
        host.num_cores, host.l1_bytes, host.l2_bytes, host.l3_bytes)


@pytest.mark.parametrize("spec", ["llvm -mcpu=core-avx2 -num-cores=4", "llvm --num-cores=4"])
def test_num_cores_accepts_one_and_two_dashes(spec):
    assert Target(spec).num_cores == 4


def test_aarch64_triple_means_neon():
    target = Target("llvm -mtriple=aarch64-linux-gnu")
    assert (target.isa, target.vector_bytes, target.march) == ("neon", 16, "armv8-a")


def test_explicit_isa_brings_its_vector_width():
    target = Target("llvm -isa=scalar")
    assert (target.isa, target.vector_bytes, target.march) == ("scalar", 0, "")


def test_dict_spec_and_keyword_overrides():
    target = Target({"kind": "llvm", "isa": "avx2", "num_cores": 3}, l2_bytes=1 << 20)
    assert (target.isa, target.vector_bytes, target.num_cores, target.l2_bytes) == ("avx2", 32, 3, 1 << 20)


@pytest.mark.parametrize("spec", [
    "llvm", "llvm -mcpu=skylake-avx512 -num-cores=8", "llvm -mtriple=aarch64-linux-gnu", "llvm -isa=scalar",
    "llvm -mcpu=znver4 -vector-bytes=32 -l3-bytes=1048576",
])
def test_canonical_string_round_trips(spec):
    target = Target(spec)
    assert Target(str(target)) == target
    assert Target(str(target)).to_json() == target.to_json()


def test_json_round_trips():
    target = Target("llvm -mcpu=cascadelake -num-cores=16")
    assert Target.from_json(target.to_json()) == target
    assert Target.parse(target.to_json()) == target


def test_from_json_requires_every_field():
    data = Target.host().to_json()
    del data["l2_bytes"]
    with pytest.raises(TargetError, match="l2_bytes"):
        Target.from_json(data)


@pytest.mark.parametrize("spec, named", [
    ("opencl", "'opencl'"), ("llvm -mcpu=pentium4", "-mcpu=pentium4"), ("llvm -num-cores=x", "-num-cores='x'"),
    ("llvm -keys=cpu", "'-keys=cpu'"), ("llvm -num-cores", "'-num-cores'"), ("llvm -mtriple=riscv64", "riscv64"),
])
def test_bad_target_string_names_the_option(spec, named):
    with pytest.raises(TargetError) as info:
        Target(spec)
    assert named in str(info.value)


def test_bad_target_string_shows_a_valid_example():
    with pytest.raises(TargetError, match=r"Target\('llvm -mcpu=core-avx2 -num-cores=4'\)"):
        Target("llvm -mcpu=pentium4")


def test_unknown_mcpu_lists_the_known_ones():
    with pytest.raises(TargetError, match="skylake-avx512.*znver3"):
        Target("llvm -mcpu=pentium4")


@pytest.mark.parametrize("fields", [
    {"isa": "sse"}, {"num_cores": 0}, {"num_cores": "4"}, {"isa": "scalar", "vector_bytes": 32}, {"march": "-O0"},
    {"colour": "red"},
])
def test_bad_fields_are_rejected(fields):
    with pytest.raises(TargetError):
        Target(fields)


def test_target_is_immutable_hashable_and_comparable():
    target = Target("llvm -num-cores=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.num_cores = 3
    assert {target: 1}[Target("llvm -num-cores=2")] == 1
    assert target != Target("llvm -num-cores=3")


def test_vector_lanes():
    assert Target("llvm -mcpu=skylake-avx512").vector_lanes("float32") == 16
    assert Target("llvm -mcpu=core-avx2").vector_lanes("float64") == 4
    assert Target("llvm -mcpu=core-avx2").vector_lanes("int8") == 32
    assert Target("llvm -isa=scalar").vector_lanes("float32") == 1
    avx512 = Target("llvm -mcpu=skylake-avx512")  # a loop shorter than a register takes a narrower vector
    assert [avx512.vector_lanes("float32", n) for n in (64, 16, 14, 7, 3)] == [16, 16, 8, 4, 4]


def test_cflags_use_march_and_never_fast_math():
    flags = Target("llvm -mcpu=znver3").cflags()
    assert "-march=znver3" in flags and "-fopenmp" in flags and "-shared" in flags
    assert not any("fast-math" in flag for flag in flags)
    assert not any(flag.startswith("-march") for flag in Target("llvm -isa=scalar").cflags())


@pytest.mark.parametrize("cpuinfo, machine, isa", [
    ("flags\t: fpu sse2 avx avx2 fma avx512f\n", "x86_64", "avx512"),
    ("flags\t: fpu sse2 avx avx2 fma\n", "x86_64", "avx2"),
    ("flags\t: fpu sse2 avx avx2\n", "x86_64", "scalar"),
    ("Features\t: fp asimd evtstrm\n", "aarch64", "neon"),
    ("", "x86_64", "scalar"),
])
def test_isa_is_read_from_cpuinfo_flags(cpuinfo, machine, isa):
    assert _isa_from_cpuinfo(cpuinfo, machine) == isa


def test_a_cpu_with_avx512_bf16_is_known_by_its_march_or_the_hosts_flags():
    """It decides whether a bfloat16 model's products read bfloat16 (graph/half.CPU_PRODUCTS)."""
    assert Target("llvm -mcpu=znver4").has_bfloat16_dot and Target("llvm -mcpu=sapphirerapids").has_bfloat16_dot
    assert not Target("llvm -mcpu=skylake-avx512").has_bfloat16_dot and not Target("llvm -isa=avx2").has_bfloat16_dot
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    assert Target.host().has_bfloat16_dot == ("avx512_bf16" in flags)
