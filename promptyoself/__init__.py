"""PromptYoSelf: let an AI agent schedule prompts to itself and deliver them via Letta."""

__version__ = "0.1.0"
