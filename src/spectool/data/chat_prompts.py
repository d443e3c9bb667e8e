"""A built-in, offline source of general chat-style prompts (no verifier).

Used to initialise "general" drafts for comparison with in-domain (math) drafts, as in NeMo RL's
chat-initialised drafts (arXiv 2604.26779). Generated combinatorially from hand-written templates,
so it ships with the code and has a clear licence.
"""

from __future__ import annotations

import itertools

_TOPICS = [
    "the ocean", "a rainy city", "learning to cook", "friendship", "the history of bicycles",
    "electric cars", "a lighthouse keeper", "how bees communicate", "the first day of school",
    "mountain hiking", "coffee", "a lost cat", "volcanoes", "public libraries", "the moon landing",
    "gardening in small spaces", "board games", "jazz music", "recycling", "sleep",
    "a job interview", "winter holidays", "the internet", "dinosaurs", "time management",
    "a birthday party", "healthy breakfasts", "trains", "photography", "a museum visit",
    "learning a new language", "rainforests", "robots", "a road trip", "saving money",
    "the color blue", "desert animals", "moving to a new town", "a haunted house", "chess",
]
_TEMPLATES = [
    "Write a short poem about {t}.",
    "Tell me an interesting fact about {t}.",
    "Write a two-sentence story about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me three tips related to {t}.",
    "Describe {t} in a few sentences.",
    "What are the pros and cons of {t}?",
    "Write a friendly email to a colleague about {t}.",
    "Summarize why people care about {t}.",
    "Suggest a title for a blog post about {t}.",
]


def chat_prompts() -> list[str]:
    """All built-in prompts, in a fixed order (400 prompts)."""
    return [tpl.format(t=t) for t, tpl in itertools.product(_TOPICS, _TEMPLATES)]
