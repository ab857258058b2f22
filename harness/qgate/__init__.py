"""qgate: gate GPU kernel candidates for LLM decode on speed and quality."""

__version__ = "0.1.0"
