"""sklearn's digits read straight from its CSV equal load_digits() exactly."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.data.sklearn_sets import load_sklearn_digits


def test_direct_read_equals_load_digits():
    from sklearn.datasets import load_digits

    images, target = load_sklearn_digits()
    bunch = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == bunch.images.dtype
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)


@pytest.mark.slow
def test_installed_package_dir_finds_a_package_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from raysim.data.base import installed_package_dir as d; "
            "print(d('sklearn').name, d('no_such_package_xyz'), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["sklearn", "None", "False"]
