"""Loads the compiled extension, which registers torch.ops.cutlassfuse.*."""

import importlib

import torch


def load_extension() -> None:
    from . import _build_info

    try:
        importlib.import_module("cutlassfuse._C")
    except ImportError as error:
        raise ImportError(
            f"cutlassfuse: the compiled extension failed to load ({error}). It was built against "
            f"torch {_build_info.TORCH_VERSION} and this process runs torch {torch.__version__}: "
            "rebuild it in this environment with `pip install --no-build-isolation .`."
        ) from error
