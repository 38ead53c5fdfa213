import ctypes
import threading

import numpy as np
import pytest

from tilecraft.errors import BuildError
from tilecraft.runtime import compile_c
from tilecraft.runtime import compiler
from tilecraft.target import Target

ADD = """
void add(const float* restrict a, const float* restrict b, float* restrict c) {
    for (int i = 0; i < 1000; ++i) c[i] = a[i] + b[i];
}
"""


def test_compiled_library_computes_vector_add(tmp_path):
    lib = ctypes.CDLL(str(compile_c(ADD, Target.host(), cache_dir=tmp_path)))
    a, b = np.arange(1000, dtype=np.float32), np.full(1000, 0.5, dtype=np.float32)
    c = np.empty(1000, dtype=np.float32)
    lib.add.argtypes = [ctypes.c_void_p] * 3
    lib.add(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    np.testing.assert_array_equal(c, a + b)


def test_same_source_is_compiled_once(tmp_path, monkeypatch):
    first = compile_c(ADD, Target.host(), cache_dir=tmp_path)

    def fail(*args, **kwargs):
        raise AssertionError("the compiler ran again")

    monkeypatch.setattr(compiler, "_run_compiler", fail)
    assert compile_c(ADD, Target.host(), cache_dir=tmp_path) == first


def test_different_flags_give_different_libraries(tmp_path):
    host = compile_c(ADD, Target.host(), cache_dir=tmp_path)
    scalar = compile_c(ADD, Target("llvm -isa=scalar"), cache_dir=tmp_path)
    assert host != scalar and host.exists() and scalar.exists()


def test_source_is_kept_next_to_the_library_and_no_temporaries_remain(tmp_path):
    lib_path = compile_c(ADD, Target.host(), cache_dir=tmp_path)
    assert lib_path.with_suffix(".c").read_text() == ADD
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lib_path.name, lib_path.with_suffix(".c").name])


def test_default_cache_dir_is_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    lib_path = compile_c(ADD, Target.host())
    assert lib_path.parent == tmp_path / ".cache" / "tilecraft" / "kernels"


def test_compile_error_reports_stderr_and_source_path(tmp_path):
    with pytest.raises(BuildError) as info:
        compile_c("void broken( { }", Target.host(), cache_dir=tmp_path)
    message = str(info.value)
    assert "error" in message
    assert str(next(tmp_path.glob("*.c"))) in message
    assert not list(tmp_path.glob("*.so"))


def test_long_compiler_errors_are_trimmed(tmp_path):
    source = "\n".join(f"int f{i}(void) {{ return undeclared_{i}; }}" for i in range(500))
    with pytest.raises(BuildError) as info:
        compile_c(source, Target.host(), cache_dir=tmp_path)
    assert len(str(info.value)) < 5000 and "(trimmed)" in str(info.value)


def test_missing_compiler_says_to_install_gcc(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="no C compiler.*install gcc"):
        compile_c(ADD, Target.host(), cache_dir=tmp_path)


def test_compile_timeout_raises_build_error(tmp_path, monkeypatch):
    # A compiler that never finishes: a real gcc under load can finish before a tiny timeout is checked.
    slow = tmp_path / "slow-cc"
    slow.write_text('#!/bin/sh\ncase "$1" in --version) echo slow-cc 1.0 ;; *) sleep 30 ;; esac\n')
    slow.chmod(0o755)
    monkeypatch.setattr(compiler, "_find_compiler", lambda: str(slow))
    with pytest.raises(BuildError, match="compile_timeout_secs"):
        compile_c(ADD + "\n// timeout", Target.host(), cache_dir=tmp_path / "cache", compile_timeout_secs=0.2)
    assert not list((tmp_path / "cache").glob("*.so"))


def test_concurrent_compiles_of_the_same_source_agree(tmp_path):
    source = ADD + "\n// concurrent"
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(compile_c(source, Target.host(), cache_dir=tmp_path)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(paths) == 3 and len(set(paths)) == 1
    ctypes.CDLL(str(paths[0])).add
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".c", ".so"]
