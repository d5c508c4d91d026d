"""The version, in a module of its own so that any room may read it without importing the package's top."""
__version__ = "0.1.0"
