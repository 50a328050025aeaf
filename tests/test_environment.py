"""The environment psyrl needs: torchvision/torchaudio/torchcodec must stay out of it."""

import importlib.util

import pytest


@pytest.mark.parametrize("package", ["torchvision", "torchaudio", "torchcodec"])
def test_package_is_not_installed(package):
    # PyPI's torchvision next to the CPU torch breaks `from transformers import Qwen2ForCausalLM`.
    assert importlib.util.find_spec(package) is None, (
        f"{package} is installed; `pip uninstall {package}`"
    )
