"""qgate: gate GPU kernel candidates for LLM decode on speed and quality."""

__version__ = "0.2.0"
