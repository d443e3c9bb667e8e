"""spectool's version (pyproject.toml's), on the ground floor: every run manifest records it (runs.py), and the
package hands it on as `spectool.__version__`."""

__version__ = "0.1.0"
