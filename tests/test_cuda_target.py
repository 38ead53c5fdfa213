import dataclasses
import sys
import types

import pytest

import tilecraft as tc
from tilecraft.errors import TargetError
from tilecraft.target import CudaTarget, Target, cuda

H100 = "cuda -arch=sm_90"


@pytest.fixture
def no_gpu(monkeypatch):
    """The detector as it answers on a machine without a GPU or without cuda-bindings."""
    monkeypatch.setattr(cuda, "_detect_device", lambda index=0: TargetError("no GPU"))


def fake_driver(attributes, status="CUDA_SUCCESS"):
    """A stand-in for ``cuda.bindings.driver``: every call returns ``(CUresult, value)``;
    ``attributes``: GPU 0's, or a list of each GPU's."""
    def cuInit(flags):
        return (status,)

    def cuDeviceGet(ordinal):
        return status, ordinal

    def cuDeviceGetAttribute(attribute, device):
        return status, (attributes[device] if isinstance(attributes, list) else attributes)[attribute]

    return types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS="CUDA_SUCCESS"), cuInit=cuInit, cuDeviceGet=cuDeviceGet,
        cuDeviceGetAttribute=cuDeviceGetAttribute,
        CUdevice_attribute=types.SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{k}": k for k in
                                                    (attributes[0] if isinstance(attributes, list) else attributes)}))


def install_driver(monkeypatch, driver):
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)


H100_PCIE = {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0, "MULTIPROCESSOR_COUNT": 114,
             "WARP_SIZE": 32, "MAX_THREADS_PER_BLOCK": 1024, "MAX_SHARED_MEMORY_PER_BLOCK": 49152,
             "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448, "MAX_REGISTERS_PER_BLOCK": 65536,
             "L2_CACHE_SIZE": 52428800}


@pytest.mark.parametrize("arch, sm_count, optin_bytes, l2_bytes", [
    ("sm_70", 80, 98304, 6 << 20), ("sm_75", 40, 65536, 4 << 20), ("sm_80", 108, 166912, 40 << 20),
    ("sm_86", 72, 101376, 6 << 20), ("sm_89", 58, 101376, 48 << 20), ("sm_90", 132, 232448, 50 << 20),
])
def test_arch_brings_its_table_facts(arch, sm_count, optin_bytes, l2_bytes):
    target = CudaTarget(f"cuda -arch={arch}")
    assert (target.kind, target.arch, target.sm_count) == ("cuda", arch, sm_count)
    assert (target.max_shared_memory_per_block_optin, target.l2_bytes) == (optin_bytes, l2_bytes)
    assert (target.warp_size, target.max_threads_per_block, target.max_shared_memory_per_block) == (32, 1024, 49152)
    assert (target.registers_per_block, target.max_registers_per_thread) == (65536, 255)
    assert (target.max_vthread, target.max_vector_bytes) == (8, 16)


def test_arch_with_a_suffix_has_the_base_facts_and_keeps_its_name():
    target = CudaTarget("cuda -arch=sm_90a")
    assert target.to_json() == {**CudaTarget(H100).to_json(), "arch": "sm_90a"}
    assert (target.nvcc_arch, target.compute_capability) == ("sm_90a", (9, 0))


@pytest.mark.parametrize("arch, capability", [("sm_70", (7, 0)), ("sm_86", (8, 6)), ("sm_90", (9, 0))])
def test_nvcc_arch_and_compute_capability(arch, capability):
    target = CudaTarget(f"cuda -arch={arch}")
    assert (target.nvcc_arch, target.compute_capability) == (arch, capability)


@pytest.mark.parametrize("spec", ["cuda -arch=sm_80 -sm-count=100", "cuda -arch=sm_80 --sm-count=100"])
def test_options_override_the_table(spec):
    target = CudaTarget(spec)
    assert (target.sm_count, target.l2_bytes) == (100, 40 << 20)


def test_every_field_is_an_option_and_keyword_overrides_win():
    target = CudaTarget("cuda -arch=sm_75 -max-shared-memory-per-block-optin=1024 -max-vthread=4", l2_bytes=7)
    assert (target.max_shared_memory_per_block_optin, target.max_vthread, target.l2_bytes) == (1024, 4, 7)
    assert CudaTarget({"kind": "cuda", "arch": "sm_86", "warp_size": 64}).warp_size == 64


@pytest.mark.parametrize("spec", [
    "cuda", "cuda -arch=sm_70", "cuda -arch=sm_90a -sm-count=114", "cuda -arch=sm_89 -max-vector-bytes=8",
])
def test_canonical_string_round_trips(spec, no_gpu):
    target = CudaTarget(spec)
    assert CudaTarget(str(target)) == target
    assert str(target).startswith(f"cuda -arch={target.arch} -sm-count={target.sm_count} -warp-size=32 ")


def test_json_round_trips():
    target = CudaTarget("cuda -arch=sm_80 -sm-count=108")
    assert CudaTarget.from_json(target.to_json()) == target
    assert Target.from_json(target.to_json()) == target


def test_from_json_requires_every_field():
    data = CudaTarget(H100).to_json()
    del data["l2_bytes"]
    with pytest.raises(TargetError, match="l2_bytes"):
        CudaTarget.from_json(data)


def test_an_arch_the_table_lacks_is_accepted_with_every_field():
    """A newer GPU, once detected, still round-trips through its string."""
    target = CudaTarget(CudaTarget(H100).to_json(), arch="sm_100a")
    assert CudaTarget(str(target)) == target and target.compute_capability == (10, 0)


@pytest.mark.parametrize("spec, named", [
    ("cuda -arch=sm_100", "sm_70, sm_75, sm_80, sm_86, sm_89, sm_90"), ("cuda -arch=90", "sm_90a"),
    ("cuda -sm-count=x", "-sm-count='x'"), ("cuda -num-cores=4", "'-num-cores=4'"), ("cuda -sm-count", "-arch=..."),
    ("cuda -arch=sm_80 -arch=sm_90", "-arch twice"), ("llvm", "Target('llvm')"), ("cuda -sm-count=0", "sm_count=0"),
])
def test_bad_string_names_the_problem_and_the_fix(spec, named):
    with pytest.raises(TargetError) as info:
        CudaTarget(spec)
    assert named in str(info.value)


@pytest.mark.parametrize("fields", [
    {"colour": "red"}, {"sm_count": "4"}, {"warp_size": True}, {"l2_bytes": -1}, {"arch": 90}, {"kind": "llvm"},
])
def test_bad_fields_are_rejected(fields):
    with pytest.raises(TargetError):
        CudaTarget({"arch": "sm_90", **fields})


def test_a_spec_of_another_type_is_rejected():
    with pytest.raises(TargetError, match="not float"):
        CudaTarget(9.0)


def test_cuda_target_is_immutable_hashable_and_comparable():
    target = CudaTarget(H100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.sm_count = 1
    assert {target: 1}[CudaTarget(H100)] == 1
    assert target != CudaTarget("cuda -arch=sm_80") and target != Target("llvm")


@pytest.mark.parametrize("spec", [H100, {"kind": "cuda", "arch": "sm_90"}, CudaTarget(H100)])
def test_target_of_kind_cuda_is_a_cuda_target(spec):
    target = tc.Target(spec)
    assert isinstance(target, tc.CudaTarget) and not isinstance(target, tc.Target)
    assert target == CudaTarget(H100)


def test_target_dispatch_passes_overrides_and_json():
    assert tc.Target(H100, sm_count=114).sm_count == 114
    assert tc.Target.parse("cuda -arch=sm_80").arch == "sm_80"
    assert isinstance(tc.Target(kind="cuda"), tc.CudaTarget)


def test_cpu_and_cuda_targets_coexist():
    cpu, gpu = tc.Target("llvm -num-cores=2"), tc.Target(H100)
    assert isinstance(cpu, tc.Target) and cpu.num_cores == 2 and cpu.kind == "llvm"
    assert isinstance(gpu, tc.CudaTarget) and gpu.kind == "cuda"
    assert {cpu: "cpu", gpu: "gpu"}[tc.Target(H100)] == "gpu"


def test_without_a_gpu_the_target_is_sm_90(no_gpu):
    assert CudaTarget() == CudaTarget("cuda") == tc.Target("cuda") == CudaTarget(H100)
    assert CudaTarget("cuda -sm-count=8").to_json() == {**CudaTarget(H100).to_json(), "sm_count": 8}


def test_without_a_gpu_device_raises_the_reason(no_gpu):
    with pytest.raises(TargetError, match="no GPU"):
        CudaTarget.device()


def test_without_cuda_bindings_the_error_says_what_to_install(monkeypatch):
    for name in ("cuda", "cuda.bindings"):  # None in sys.modules makes the import fail, even once imported
        monkeypatch.setitem(sys.modules, name, None)
    found = cuda._detect_device.__wrapped__()
    assert isinstance(found, TargetError) and "pip install -e '.[cuda]'" in str(found)


def test_the_device_is_read_through_the_driver(monkeypatch):
    install_driver(monkeypatch, fake_driver(H100_PCIE))
    found = cuda._detect_device.__wrapped__()
    assert found == CudaTarget(H100, sm_count=114)
    monkeypatch.setattr(cuda, "_detect_device", lambda index=0: found)
    assert CudaTarget.device() is found
    assert (CudaTarget("cuda") == found
            and CudaTarget("cuda -l2-bytes=1").to_json() == {**found.to_json(), "l2_bytes": 1})
    assert CudaTarget("cuda -arch=sm_80").sm_count == 108  # an arch names the table's facts, not the device's


def test_the_facts_of_each_gpu_are_read_by_its_index(monkeypatch):
    a100 = {**H100_PCIE, "COMPUTE_CAPABILITY_MAJOR": 8, "MULTIPROCESSOR_COUNT": 108,
            "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 166912, "L2_CACHE_SIZE": 40 << 20}
    install_driver(monkeypatch, fake_driver([H100_PCIE, a100]))
    assert cuda._detect_device.__wrapped__(1) == CudaTarget("cuda -arch=sm_80")
    assert cuda._detect_device.__wrapped__() == CudaTarget(H100, sm_count=114)
    monkeypatch.setattr(cuda, "_detect_device", lambda index=0: f"GPU {index}")
    assert CudaTarget.device(1) == "GPU 1" and CudaTarget.device() == "GPU 0"


def test_a_driver_error_is_named(monkeypatch):
    install_driver(monkeypatch, fake_driver(H100_PCIE, status="CUDA_ERROR_NO_DEVICE"))
    found = cuda._detect_device.__wrapped__()
    assert isinstance(found, TargetError) and "cuInit" in str(found) and "CUDA_ERROR_NO_DEVICE" in str(found)


def test_detection_is_cached():
    assert cuda._detect_device() is cuda._detect_device()
