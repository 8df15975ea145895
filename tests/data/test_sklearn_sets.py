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


def test_client_tensors_have_the_strides_of_a_pickled_copy():
    """A 1x8x8 image's channel stride is free; here it must be the canonical one a pickled (or Ray-shipped) copy of
    the data gives, or a convolution takes another kernel (channels-last) and rounds differently in process."""
    import pickle

    import torch

    from raysim.config import load_config
    from raysim.data import build_federated_data

    data = build_federated_data(load_config(None, ["data.name=sklearn_digits", "data.partition=iid", "clients.num=2"]))
    x, _, _ = data.tensors(0, "train")
    shipped, _, _ = pickle.loads(pickle.dumps(data, protocol=5)).tensors(0, "train")
    assert x.stride() == shipped.stride() == torch.empty(x.shape).stride() and torch.equal(x, shipped)
    conv = torch.nn.Conv2d(1, 4, 3, padding=1)
    assert torch.equal(conv(x[:16]), conv(shipped[:16]))
