"""The models the tests deploy, by exo's model id, named once."""

from __future__ import annotations

QWEN = "mlx-community/Qwen3-0.6B-4bit"
LLAMA = "mlx-community/Llama-3.2-1B-Instruct-4bit"
