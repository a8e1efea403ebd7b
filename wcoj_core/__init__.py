"""wcoj: incremental worst-case-optimal joins (the package's version is read from here)."""

__version__ = "0.1.0"
