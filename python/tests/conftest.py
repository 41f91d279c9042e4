"""Shared fixtures: the kvsim binary (CLI cross-checks) and the array backends
the suite runs on: numpy, torch CPU, and torch CUDA where a GPU is present
(KVSIM_TEST_DEVICE=cuda forces it, failing without one)."""

import os
import subprocess

import numpy as np
import pytest

try:
    import torch
except ImportError:
    torch = None

KVSIM = os.environ.get("KVSIM_BINARY", "kvsim")
DEVICES = ["cpu"]
if torch is not None and (torch.cuda.is_available() or os.environ.get("KVSIM_TEST_DEVICE") == "cuda"):
    DEVICES.append("cuda")


def run_cli(*args):
    r = subprocess.run([KVSIM, *map(str, args)], capture_output=True, text=True)
    return r


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
