"""The serving APIs the load generator speaks: their names (llm_bench's `api`) and paths."""
from __future__ import annotations

API_OPENAI_CHAT = "openai_chat"
API_OPENAI_COMPLETIONS = "openai_completions"
API_SGLANG_GENERATE = "sglang_generate"
APIS = (API_OPENAI_CHAT, API_OPENAI_COMPLETIONS, API_SGLANG_GENERATE)

API_PATHS = {
    API_OPENAI_CHAT: "/v1/chat/completions",
    API_OPENAI_COMPLETIONS: "/v1/completions",
    API_SGLANG_GENERATE: "/generate",
}
