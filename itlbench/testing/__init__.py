"""Test peers: servers that stand in for an LLM server so the client can be measured against a known truth
(they are never used by a real run)."""
