"""cyto's version (``cyto.__version__``), in a bottom module that every layer may import."""

__version__ = "0.1.0"
