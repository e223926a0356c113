"""The version of harness (a module of its own: the core reads it without importing the package
root, which imports the remote-object layer)."""

__version__ = "0.1.0"
