"""A PEP 517 backend whose every hook refuses, naming the right command:
the fastpath package is built from the repository root (pyproject.toml
there), which builds libfastpath and bundles it in the wheel."""
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent.parent


def _refuse(*args, **kwargs):
    sys.stderr.write(
        "fastpath: bindings/python is not a package on its own (it needs libfastpath).\n"
        f"Install from the repository root, which builds and bundles the library:\n"
        f"    pip install {_ROOT}\n"
        "(from the root: pip install .  ;  with PyTorch: pip install '.[torch]')\n")
    raise SystemExit(1)


get_requires_for_build_wheel = get_requires_for_build_sdist = get_requires_for_build_editable = _refuse
prepare_metadata_for_build_wheel = prepare_metadata_for_build_editable = _refuse
build_wheel = build_sdist = build_editable = _refuse
