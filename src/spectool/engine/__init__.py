"""The only package area that talks to vLLM (imports stay inside functions: `--help` is fast)."""
