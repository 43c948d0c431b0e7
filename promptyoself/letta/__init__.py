"""The Letta client: every HTTP call PromptYoSelf makes to a Letta server (docs/design.md §Letta)."""
