"""The kernel's compiled inner loops (`wcoj_core/kernel/_native.c`), built by `pip install`.

Everything else about the package is in pyproject.toml. The build stamps the module with a
hash of its source, so a checkout whose C source moved on is noticed at import
(`wcoj_core.kernel.native`) and the module built again once, never run stale.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "wcoj_core/kernel/_native.c"
DIGEST = hashlib.sha256(Path(SOURCE).read_bytes()).hexdigest()[:16]

setup(
    ext_modules=[
        Extension(
            "wcoj_core.kernel._native",
            [SOURCE],
            define_macros=[("WCOJ_SOURCE_HASH", f'"{DIGEST}"')],
            extra_compile_args=["-O3", "-std=gnu11"],
            libraries=["z"],
        )
    ]
)
