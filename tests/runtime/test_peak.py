from tilecraft.runtime.peak import peak_gflops


def test_peak_is_measured_once_per_target():
    peak = peak_gflops()
    assert 1 < peak < 1e5  # GFLOPS of any CPU that runs the tests
    assert peak_gflops() == peak  # cached: a summary asks for it after every tuning run
