"""itlbench: measure what long prompts do to streaming LLM latency."""

__version__ = "0.1.0"
